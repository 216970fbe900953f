"""The endpoint's security model: tokens on TCP, peer uid on the Unix socket, SQL sandbox,
and a training that survives every bad request."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import subprocess

import pytest
from helpers import free_port, script, td_run

PATHS = [
    ("GET", "/v1/status"),
    ("GET", "/v1/backtrace"),
    ("POST", "/v1/eval"),
    ("POST", "/v1/query"),
    ("GET", "/v1/tables"),
    ("GET", "/v1/diagnoses"),
    ("POST", "/v1/config"),
    ("GET", "/no/such/path"),
]


def _request(port: int, method: str, path: str, token: str | None, body: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    conn.request(method, path, body=body if body is not None else b"{}", headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


@pytest.fixture(scope="module")
def tcp(shared_launch):
    """One training run on TCP with a token, that every test here abuses in turn (each checks
    that it trains on)."""
    port = free_port()
    run = shared_launch(
        # --pause 0.02: steps enough to see that it trains on, not half a core for the module
        td_run(
            "--listen",
            f"127.0.0.1:{port}",
            "--token",
            "s3cret",
            script("trainer.py"),
            "--pause",
            "0.02",
        )
    )
    run.wait_probe()
    run.wait_steps(1)
    run.port = port
    yield run
    run.stop()


def test_tcp_needs_the_token_on_every_path(tcp) -> None:
    for method, path in PATHS:
        for token in (None, "", "wrong", "s3cret-but-longer", "S3CRET"):
            status, body = _request(tcp.port, method, path, token)
            assert status == 401, (method, path, token, status)
            assert b"code" not in body  # nothing ran: no routing happened
    # With the right token, the same paths are served (or honestly 404).
    status, _ = _request(tcp.port, "GET", "/v1/status", "s3cret")
    assert status == 200
    status, _ = _request(tcp.port, "GET", "/no/such/path", "s3cret")
    assert status == 404
    status, body = _request(tcp.port, "POST", "/v1/eval", "s3cret", b'{"code": "6 * 7"}')
    assert status == 200 and json.loads(body)["value"] == "42"


def test_bad_requests_get_clear_errors_and_training_goes_on(tcp) -> None:
    cases = [
        (b"not json", 400),
        (b"[1, 2]", 400),
        (b'{"code": 5}', 400),
        (b'{"sql": null}', 400),
    ]
    for body, expected in cases:
        path = "/v1/query" if b"sql" in body else "/v1/eval"
        status, data = _request(tcp.port, "POST", path, "s3cret", body)
        assert status == expected, (body, status, data)
        assert "error" in json.loads(data)
    # A body announced too large is refused before it is read.
    with socket.create_connection(("127.0.0.1", tcp.port), timeout=30) as s:
        s.sendall(
            b"POST /v1/eval HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
            b"Content-Length: 9437184\r\n\r\n"
        )
        assert s.recv(100).startswith(b"HTTP/1.1 413")
    before = tcp.steps()
    tcp.wait_steps(before + 3)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "COPY (SELECT 1) TO '/tmp/td-should-not-exist.csv'",
        "ATTACH '/tmp/td-should-not-exist.db'",
        "INSTALL httpfs",
        "SET enable_external_access = true",
    ],
)
def test_sql_cannot_touch_files_network_or_settings(tcp, sql) -> None:
    out = tcp.cli(str(tcp.pid), "query", sql)
    assert out.returncode == 1, out.stdout
    assert "Traceback" not in out.stderr
    assert not os.path.exists("/tmp/td-should-not-exist.csv")
    assert not os.path.exists("/tmp/td-should-not-exist.db")


def test_query_time_limit(tcp) -> None:
    out = tcp.cli(
        str(tcp.pid),
        "--timeout",
        "1",
        "query",
        "SELECT count(*) FROM range(10000000000) a, range(1000) b",
    )
    assert out.returncode == 1
    assert "time limit" in out.stderr
    before = tcp.steps()
    tcp.wait_steps(before + 2)


@pytest.fixture(scope="module")
def unix(shared_launch):
    """One training run on its Unix socket only, for the tests of that socket (each leaves
    the socket and its directory as it found them)."""
    run = shared_launch(td_run(script("trainer.py"), "--pause", "0.02"))
    run.wait_probe()
    yield run
    assert run.stop() == 0, run.output()


def test_unix_socket_and_directory_are_private(unix) -> None:
    sock = unix.entry()["socket"]
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(sock)).st_mode) == 0o700


SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
    reason="needs root (to act as another uid) and a system python3 that uid can run",
)
def test_another_uid_cannot_use_the_socket(unix) -> None:
    run = unix
    sock = run.entry()["socket"]
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "    s.sendall(b'GET /v1/status HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
        "    print('answer:', s.recv(100))\n"
        "except OSError as e:\n"
        "    print('refused:', e)\n"
    )

    def as_nobody() -> str:
        out = subprocess.run(
            [SYSTEM_PYTHON, "-c", probe, sock],
            capture_output=True,
            text=True,
            preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)),
        )
        return out.stdout

    # The file permissions stop another user...
    assert "refused" in as_nobody()
    # ...and so does the server's own peer-uid check, should the permissions ever be loose.
    os.chmod(os.path.dirname(sock), 0o755)
    os.chmod(sock, 0o666)
    answer = as_nobody()
    assert "answer: b''" in answer or "refused" in answer, answer
    assert "200" not in answer
    os.chmod(os.path.dirname(sock), 0o700)
    os.chmod(sock, 0o600)
    # Still serving its own user.
    assert run.cli(str(run.pid), "eval", "1").returncode == 0


def test_insecure_socket_directory_is_refused(env, tmp_path) -> None:
    from helpers import cli

    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    os.chmod(loose, 0o777)
    out = cli("list", env=dict(env, TORCHDOCTOR_SOCKET_DIR=str(loose)))
    assert out.returncode == 2
    assert "0700" in out.stderr
