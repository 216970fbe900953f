"""Requests to another rank's endpoint: HTTP/1.1 over its Unix socket or its TCP port (with
its token), JSON both ways. Every failure becomes `Unreachable` with the reason in words."""

from __future__ import annotations

import dataclasses
import http.client
import json
from typing import Any

from torchdoctor.unix_http import UnixHTTPConnection


class Unreachable(Exception):
    """The rank could not be asked; the message says why."""


@dataclasses.dataclass(frozen=True)
class Target:
    label: str  # for messages: "rank 3 (unix socket)", "rank 3 at 10.0.0.2:4321"
    socket_path: str | None = None
    host: str | None = None
    port: int | None = None
    token: str | None = None

    @property
    def via(self) -> str:
        return "unix" if self.socket_path else "tcp"

    @property
    def address(self) -> str:
        return self.socket_path or f"{self.host}:{self.port}"


def request(
    target: Target,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = 5.0,
) -> tuple[int, dict[str, Any]]:
    """(status, payload) for 200 and 422 (the target ran the request and reported an error)."""
    headers = {"Content-Type": "application/json"}
    if target.token:
        headers["Authorization"] = f"Bearer {target.token}"
    conn: http.client.HTTPConnection
    if target.socket_path:
        conn = UnixHTTPConnection(target.socket_path, timeout)
    else:
        conn = http.client.HTTPConnection(target.host or "127.0.0.1", target.port, timeout=timeout)
    data = json.dumps(body).encode() if body is not None else None
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
    except TimeoutError:
        raise Unreachable(
            f"no answer from {target.address} within {timeout:g} s "
            "(the process is stopped, or holds the GIL in a long C call)"
        ) from None
    except (ConnectionRefusedError, FileNotFoundError):
        raise Unreachable(
            f"nothing listens at {target.address} (the process has exited?)"
        ) from None
    except OSError as exc:
        raise Unreachable(f"cannot connect to {target.address}: {exc}") from None
    finally:
        conn.close()
    try:
        payload = json.loads(raw) if raw else {}
    except ValueError:
        raise Unreachable(f"{target.address} answered something that is not JSON") from None
    if response.status == 401:
        raise Unreachable(f"{target.address} refused the token (pass --token or TORCHDOCTOR_TOKEN)")
    if response.status == 404:
        raise Unreachable(f"{target.address} has no cluster endpoints (an older torchdoctor?)")
    if response.status not in (200, 422):
        message = payload.get("error") if isinstance(payload, dict) else None
        raise Unreachable(f"{target.address}: {message or f'HTTP {response.status}'}")
    return response.status, payload
