"""A real headless Chromium for the tests of the HTML report: the page drawn as a browser draws
it, offline (any request the page made would go to a closed port)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import pytest

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # Any request the page made would go to a closed port: the page must need none.
    "--proxy-server=127.0.0.1:9",
)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(
            "no Chromium to render the report in: install Debian's package "
            "(`apt-get install -y chromium`; .ci/run does it before `make test`)"
        )
    return found


def browser(binary: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp(prefix="td-chromium-")
    try:
        return subprocess.run(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)
