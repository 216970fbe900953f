"""The Context every CLI verb gets besides its own arguments: the target, its token, the time
limit, and where the verb's output and warnings go."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchdoctor.cli.client import ProbeClient


class Context:
    """What every verb gets besides its own arguments."""

    def __init__(self, endpoint: str | None, token: str | None, timeout: float | None) -> None:
        self.endpoint = endpoint
        self.token = token
        self.timeout = timeout
        self.out = sys.stdout
        self.err = sys.stderr

    def client(self) -> ProbeClient:
        from torchdoctor.cli.client import DEFAULT_TIMEOUT, ProbeClient
        from torchdoctor.cli.endpoint import resolve

        # --timeout bounds the work in the target (a query's time limit); the answer may take
        # a little longer to arrive.
        wait = (self.timeout + 5.0) if self.timeout else DEFAULT_TIMEOUT
        return ProbeClient(resolve(self.endpoint, self.token), wait)

    def print(self, text: str = "") -> None:
        print(text, file=self.out)

    def warn(self, text: str) -> None:
        print(text, file=self.err)
