"""Exit codes (docs/cli.md): 0 success, 1 the target reported an error, 2 usage or connection."""

from __future__ import annotations

OK = 0
TARGET_ERROR = 1
USAGE = 2


class CliError(Exception):
    """Ends the command with `message` on stderr and exit code `code`."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code
