"""Talks to a probe's endpoint: HTTP/1.1 over a Unix socket or TCP, JSON both ways."""

from __future__ import annotations

import dataclasses
import http.client
import json
from typing import Any

from torchdoctor.cli.errors import CliError
from torchdoctor.unix_http import UnixHTTPConnection

DEFAULT_TIMEOUT = 30.0


@dataclasses.dataclass
class Address:
    label: str  # what the user typed, for messages
    socket_path: str | None = None
    host: str | None = None
    port: int | None = None
    token: str | None = None
    pid: int | None = None


class ProbeClient:
    def __init__(self, address: Address, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.address = address
        self.timeout = timeout

    def _connection(self) -> http.client.HTTPConnection:
        a = self.address
        if a.socket_path:
            return UnixHTTPConnection(a.socket_path, self.timeout)
        assert a.host is not None and a.port is not None
        return http.client.HTTPConnection(a.host, a.port, timeout=self.timeout)

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """(status, payload) for 200 and 422; raises CliError for everything that is not an
        answer from the target's code (connection, auth, protocol)."""
        headers = {"Content-Type": "application/json"}
        if self.address.token:
            headers["Authorization"] = f"Bearer {self.address.token}"
        data = json.dumps(body).encode() if body is not None else None
        conn = self._connection()
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except TimeoutError:
            raise CliError(
                f"{self.address.label} did not answer within {self.timeout:g} s "
                "(is the process stopped, or holding the GIL in a long C call?)"
            ) from None
        except (ConnectionRefusedError, FileNotFoundError):
            raise CliError(
                f"cannot reach {self.address.label}: nothing is listening there "
                "(has the process exited?)"
            ) from None
        except OSError as exc:
            raise CliError(f"cannot reach {self.address.label}: {exc}") from None
        finally:
            conn.close()
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            raise CliError(f"{self.address.label} answered something that is not JSON") from None
        status = response.status
        if status == 401:
            raise CliError(
                f"{self.address.label} refused the request: missing or wrong token "
                "(pass --token or set TORCHDOCTOR_TOKEN)"
            )
        if status not in (200, 422):
            raise CliError(f"{self.address.label}: {payload.get('error') or f'HTTP {status}'}")
        return status, payload
