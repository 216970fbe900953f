"""Secrets never reach a command line torchdoctor writes or shows."""

from __future__ import annotations

import pytest

from torchdoctor.redact import MASK, command_line, redact_argv, redact_text


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--token", "T0ps3cret", "x.py"], ["run", "--token", MASK, "x.py"]),
        (["run", "--token=T0ps3cret", "x.py"], ["run", f"--token={MASK}", "x.py"]),
        (["x.py", "--hf-token", "hf_abc"], ["x.py", "--hf-token", MASK]),
        (["x.py", "--api_key=k-123"], ["x.py", f"--api_key={MASK}"]),
        (["x.py", "--db-password", "pw"], ["x.py", "--db-password", MASK]),
        (
            ["env", "TORCHDOCTOR_TOKEN=abcd", "python"],
            ["env", f"TORCHDOCTOR_TOKEN={MASK}", "python"],
        ),
        (["x.py", "--token"], ["x.py", "--token"]),  # nothing to hide
        # Ordinary options that only look alike are kept.
        (["x.py", "--max-tokens", "20", "--tokenizer", "bpe"], None),
        (["x.py", "--token-file", "/run/t"], None),
        (["x.py", "max_new_tokens=5"], None),
    ],
)
def test_redact_argv(argv: list[str], expected: list[str] | None) -> None:
    assert redact_argv(argv) == (argv if expected is None else expected)


def test_known_secret_values_are_masked_anywhere() -> None:
    argv = ["python", "train.py", "--note", "key-is-Sup3rS3cret!", "--lr", "3"]
    out = redact_argv(argv, ["Sup3rS3cret", None, ""])
    assert out == ["python", "train.py", "--note", f"key-is-{MASK}!", "--lr", "3"]
    # Values too short to be a real secret would mask ordinary text: left alone.
    assert redact_argv(["--lr", "3"], ["3"]) == ["--lr", "3"]


def test_text_and_display() -> None:
    assert (
        redact_text("TORCHDOCTOR_TOKEN=abc python x.py") == f"TORCHDOCTOR_TOKEN={MASK} python x.py"
    )
    assert command_line(["torchdoctor", "run", "--token", "zz-top", "a.py"]) == (
        f"torchdoctor run --token {MASK} a.py"
    )
    assert command_line(None) == ""
