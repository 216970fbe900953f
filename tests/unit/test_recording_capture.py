"""tests/recording.py's captured(): a library that sets up its logging while a script's
output is captured keeps working after the capture ends (the next in-process run logs)."""

from __future__ import annotations

import logging
import sys

from recording import captured


def test_a_handler_made_during_a_capture_writes_after_it() -> None:
    # transformers binds its handler's flush to the stderr of the moment it is imported; the
    # same is done here with a logger of the test's own, so that the test does not depend on
    # whether transformers was imported before.
    logger = logging.getLogger("td-test-capture")
    try:
        with captured() as first:
            handler = logging.StreamHandler()  # on the captured stderr
            handler.flush = sys.stderr.flush  # type: ignore[method-assign]
            logger.addHandler(handler)
            logger.warning("one")
        with captured() as second:
            logger.warning("two")
    finally:
        logger.handlers.clear()
    assert first.stderr == "one\n"
    assert second.stderr == "two\n", second.stderr  # no "--- Logging error ---"
