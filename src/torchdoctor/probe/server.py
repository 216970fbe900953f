"""A small HTTP server on daemon threads: a Unix socket (same uid only) and, if asked, TCP.

Security (docs/security.md): the Unix socket is 0600 in a 0700 per-user directory and every
connection's peer uid is checked; TCP always needs the token, compared in constant time,
before any routing. Nothing here can raise into the training.

Abuse (docs/security.md): a request (line, headers and body) must arrive within
REQUEST_TIMEOUT of the client's first byte being awaited, so a client that never finishes its
headers holds a thread for seconds, not forever; an answer must be sent within SEND_TIMEOUT;
at most MAX_CONNECTIONS connections are served at once (the rest wait in the listen queue);
bodies over MAX_BODY are refused with 413 before they are read, chunked bodies with 411;
routes marked heavy (queries) run, encode and send one at a time, so many concurrent queries
cost the memory of one.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import logging
import os
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from torchdoctor import _json

log = logging.getLogger("torchdoctor")

MAX_BODY = 1024 * 1024  # SQL and code: a megabyte is plenty
REQUEST_TIMEOUT = 10.0  # seconds for a whole request to arrive
SEND_TIMEOUT = 10.0  # seconds for an answer to be taken by the client
MAX_CONNECTIONS = 32  # served at once; more wait in the listen queue
LISTEN_QUEUE = 128
ENCODE_ROWS = 2000  # rows of an answer encoded per call (see encode)
Handler = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


class Routes:
    """(method, path) -> handler taking the request's JSON (or query string) as a dict."""

    def __init__(self) -> None:
        self.table: dict[tuple[str, str], Handler] = {}
        self.heavy: set[tuple[str, str]] = set()

    def add(self, method: str, path: str, handler: Handler, heavy: bool = False) -> None:
        """`heavy`: the answer may be large (query results): served one at a time."""
        self.table[(method, path)] = handler
        if heavy:
            self.heavy.add((method, path))


def encode(payload: dict[str, Any]) -> bytes:
    """JSON, with non-finite floats as the strings nan/inf/-inf. A long `rows` list is encoded
    ENCODE_ROWS at a time: json's C encoder holds the GIL for a whole call, and the training
    thread must get it back every few milliseconds, not once a second."""
    rows = payload.get("rows")
    if not isinstance(rows, list) or len(rows) <= ENCODE_ROWS:
        return _dumps(payload).encode()
    head = _dumps({k: v for k, v in payload.items() if k != "rows"})
    parts = [_dumps(rows[i : i + ENCODE_ROWS])[1:-1] for i in range(0, len(rows), ENCODE_ROWS)]
    rest = ", " if len(head) > 2 else ""
    return f'{head[:-1]}{rest}"rows": [{", ".join(parts)}]}}'.encode()


def _dumps(value: Any) -> str:
    return _json.dumps(value)


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes, as long as the current request's deadline has not passed."""

    def __init__(self, sock: socket.socket, handler: _RequestHandler) -> None:
        self._sock = sock
        self._handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._handler.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._sock.settimeout(remaining)
        return self._sock.recv_into(buffer)


class _RequestHandler(BaseHTTPRequestHandler):
    server: _ServerMixin  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"
    server_version = "torchdoctor"
    sys_version = ""
    deadline = 0.0

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the plain socket file: replaced by one that keeps the deadline
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self))

    def handle_one_request(self) -> None:
        self.deadline = time.monotonic() + REQUEST_TIMEOUT
        super().handle_one_request()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        try:
            if not self._authorized():
                self._send(401, {"error": "unauthorized: missing or wrong token"})
                return
            url = urlsplit(self.path)
            handler = self.server.routes.table.get((method, url.path))
            if handler is None:
                known = any(p == url.path for _, p in self.server.routes.table)
                status = 405 if known else 404
                self._send(status, {"error": f"no such endpoint: {method} {url.path}"})
                return
            request = self._read_request(method, url.query)
            if request is None:
                return
            heavy = (method, url.path) in self.server.routes.heavy
            with self.server.heavy_slot if heavy else contextlib.nullcontext():
                status, payload = handler(request)
                self._send(status, payload)
        except TimeoutError:
            self.close_connection = True  # the client stopped reading: nothing more to say
        except Exception as exc:  # a bug in a handler: answer 500, keep serving
            log.debug("torchdoctor probe handler failed", exc_info=True)
            try:
                self._send(500, {"error": f"internal error in the probe: {exc!r}"})
            except OSError:
                pass

    def _authorized(self) -> bool:
        token = self.server.token
        if token is None:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            given = ""
        return hmac.compare_digest(given.strip().encode(), token.encode())

    def _read_request(self, method: str, query: str) -> dict[str, Any] | None:
        request: dict[str, Any] = {k: v[-1] for k, v in parse_qs(query).items()}
        if self.headers.get("Transfer-Encoding"):
            self._send(411, {"error": "send the body with a Content-Length, not chunked"})
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self._send(413, {"error": f"request body must be 0..{MAX_BODY} bytes"})
            return None
        try:
            raw = self.rfile.read(length) if length else b""
        except TimeoutError:
            self._send(408, {"error": f"the request did not arrive within {REQUEST_TIMEOUT:g} s"})
            return None
        if len(raw) < length:
            self.close_connection = True  # the client hung up half way
            return None
        if method != "POST":
            return request
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, RecursionError):  # RecursionError: [[[[... nested too deep
            self._send(400, {"error": "request body is not JSON"})
            return None
        if not isinstance(body, dict):
            self._send(400, {"error": "request body must be a JSON object"})
            return None
        request.update(body)
        return request

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = encode(payload)
        if status >= 400:
            self.close_connection = True  # what is left of a refused request is not parsed
        self.connection.settimeout(SEND_TIMEOUT)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # never write to the training's stderr

    def address_string(self) -> str:
        return str(self.client_address or "unix")


class _ServerMixin(socketserver.ThreadingMixIn):
    daemon_threads = True
    request_queue_size = LISTEN_QUEUE
    routes: Routes
    token: str | None
    shutdown_request: Callable[[Any], None]  # socketserver.BaseServer's
    _thread_count = 0

    def _limits(self) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.heavy_slot = threading.Lock()
        self._closing = threading.Event()

    def process_request(self, request: Any, client_address: Any) -> None:
        # At the cap, wait for a slot (new connections queue in the kernel meanwhile); slow
        # clients free theirs within REQUEST_TIMEOUT.
        while not self._slots.acquire(timeout=0.5):
            if self._closing.is_set():
                self.shutdown_request(request)
                return
        # Named threads: torchdoctor's own threads are left out of python.backtrace.
        _ServerMixin._thread_count += 1
        thread = threading.Thread(
            target=self._serve_one,
            args=(request, client_address),
            name=f"torchdoctor-request-{_ServerMixin._thread_count}",
            daemon=True,
        )
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: drop this connection, keep serving
            self._slots.release()
            self.shutdown_request(request)

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def shutdown(self) -> None:
        self._closing.set()
        super().shutdown()  # type: ignore[misc]

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("torchdoctor probe connection error", exc_info=True)


class UnixServer(_ServerMixin, socketserver.UnixStreamServer):
    def __init__(self, path: Path, routes: Routes) -> None:
        self.routes = routes
        self.token = None
        self.path = path
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        self._limits()
        old = os.umask(0o177)  # the socket is born 0600: no window where others could connect
        try:
            super().__init__(str(path), _RequestHandler)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        uid = peer_uid(request)
        if uid != os.getuid():
            log.warning("torchdoctor: refused a connection from uid %s", uid)
            return False
        return True

    def server_close(self) -> None:
        super().server_close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class TcpServer(_ServerMixin, HTTPServer):
    allow_reuse_address = True

    def __init__(self, host: str, port: int, token: str, routes: Routes) -> None:
        if not token:
            raise ValueError("a TCP endpoint needs a token")
        self.routes = routes
        self.token = token
        self._limits()
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _RequestHandler)


def peer_uid(sock: socket.socket) -> int | None:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):  # no SO_PEERCRED (macOS): fall back to getpeereid
        try:
            return int(sock.getpeereid()[0])  # type: ignore[attr-defined]
        except Exception:
            return None
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


# How often an idle server looks at its shutdown flag: stop() waits up to this long per
# server (a session in a test ends in milliseconds); 20 idle wake-ups a second cost nothing.
POLL_INTERVAL = 0.05


def serve_in_background(server: socketserver.BaseServer, name: str) -> threading.Thread:
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": POLL_INTERVAL},
        name=name,
        daemon=True,
    )
    thread.start()
    return thread
