"""A small HTTP server on daemon threads: a Unix socket (same uid only) and, if asked, TCP.

Security (docs/security.md): the Unix socket is 0600 in a 0700 per-user directory and every
connection's peer uid is checked; TCP always needs the token, compared in constant time,
before any routing. Request bodies are capped. Nothing here can raise into the training.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from torchdoctor._json import dumps

log = logging.getLogger("torchdoctor")

MAX_BODY = 8 * 1024 * 1024
Handler = Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]


class Routes:
    """(method, path) -> handler taking the request's JSON (or query string) as a dict."""

    def __init__(self) -> None:
        self.table: dict[tuple[str, str], Handler] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        self.table[(method, path)] = handler


class _RequestHandler(BaseHTTPRequestHandler):
    server: _ServerMixin  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"
    server_version = "torchdoctor"
    sys_version = ""

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
            status, payload = handler(request)
            self._send(status, payload)
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
        if method != "POST":
            return request
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self._send(413, {"error": f"request body must be 0..{MAX_BODY} bytes"})
            return None
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, {"error": "request body is not JSON"})
            return None
        if not isinstance(body, dict):
            self._send(400, {"error": "request body must be a JSON object"})
            return None
        request.update(body)
        return request

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # never write to the training's stderr

    def address_string(self) -> str:
        return str(self.client_address or "unix")


class _ServerMixin(socketserver.ThreadingMixIn):
    daemon_threads = True
    routes: Routes
    token: str | None
    _thread_count = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        # Named threads: torchdoctor's own threads are left out of python.backtrace.
        _ServerMixin._thread_count += 1
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"torchdoctor-request-{_ServerMixin._thread_count}",
            daemon=True,
        )
        thread.start()

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


def serve_in_background(server: socketserver.BaseServer, name: str) -> threading.Thread:
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.5}, name=name, daemon=True
    )
    thread.start()
    return thread
