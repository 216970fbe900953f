"""What `torchdoctor run` says, read as a person reads it, compared as text: a crash is
explained once, after its traceback, and the summary names it without saying it again; an
alert waits for the end of the line the script is writing on the terminal; no message of ours
says "torchdoctor: torchdoctor"."""

from __future__ import annotations

import re
import subprocess

from helpers import internal_errors, script, td_run

from integration.test_terminal import _on_a_terminal, screen


def _normal(text: str) -> str:
    """Run-specific numbers and paths made fixed: pids, run directories, timings."""
    text = re.sub(r"pid \d+", "pid N", text)
    text = re.sub(r"\S*torchdoctor-runs/\S+", "RUN_DIR", text)
    text = re.sub(r"\d+(\.\d+)? (ms|s|us)\b", "T", text)
    return re.sub(r"\d+%", "P%", text)


def test_a_crash_is_explained_once_after_its_traceback(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = subprocess.run(
        td_run(script("shape_channels.py")),
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr
    assert not internal_errors(out.stderr), out.stderr
    head, traceback_and_rest = out.stderr.split("Traceback (most recent call last):\n", 1)
    # nothing of the crash before its traceback: the probe's line only
    assert _normal(head) == "torchdoctor: probing pid N; run directory RUN_DIR\n"
    error = "RuntimeError: Given groups=1, weight of size [6, 3, 5, 5], expected input"
    _frames, explained = traceback_and_rest.split(error, 1)
    after = _normal(explained).splitlines()[1:]  # the rest of the error's line first
    assert after[0] == "torchdoctor: shape.conv_input: Convolution input has the wrong shape"
    summary = after.index("torchdoctor summary")
    assert after[summary - 1] == ""
    assert after[summary:] == [
        "torchdoctor summary",
        "  3 steps in T (T/step)",
        "  time: data P%, forward P%, backward P%, optimizer P%, other P%",
        "  1 diagnosis:",
        "    ERROR [crash] at step 3 in features.0 (above)",
        "  run directory: RUN_DIR",
        '  query it: torchdoctor query RUN_DIR "SELECT * FROM python.steps"',
    ]
    block = after[:summary]
    # the fix for this run, whole: the layer, its real numbers, the line that builds it
    assert "  fix: Make features.0 take 1 input channels (or convert the data)" in block
    assert "    self.features[0] = nn.Conv2d(1, 6, kernel_size=5)" in block
    assert out.stderr.count("features.0 is an nn.Conv2d with 3 input channels") == 1
    assert "torchdoctor: torchdoctor" not in out.stderr


def test_an_alert_waits_for_the_end_of_the_scripts_line(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The script spends its time inside its table's rows; the NaN of step 6 is found there.
    code, raw = _on_a_terminal(td_run(script("table_nan.py"), "0.3", "24"), env, tmp_path)
    assert code == 0, raw[-3000:]
    lines = [line for line in screen(raw) if line.strip()]
    assert lines[1] == "step |     loss | grad norm"
    rows = [line for line in lines if re.match(r"\s+\d+ \|", line)]
    assert len(rows) == 24, lines  # every row whole, on a line of its own
    for row in rows:
        assert re.fullmatch(r"\s+\d+ \| +(nan|\d+\.\d{4}) \| +(nan|\d+\.\d{4})", row), row
    alert = lines.index("torchdoctor ERROR [nan] at step 6 in input batch")
    assert lines[alert + 1] == "  Step 6: the input batch itself contains 1 NaN."
    # found while the script was inside a row (it spends its time there): shown between two
    # rows of the table, after the NaN's
    before, after = lines[alert - 1], lines[alert + 4]
    assert re.match(r"\s+\d+ \|", before) and int(before.split("|")[0]) >= 6, lines
    assert re.match(r"\s+\d+ \|", after), lines
    assert "    ERROR [nan] at step 6 in input batch (above)" in lines
    assert "torchdoctor: torchdoctor" not in raw.decode(errors="replace")
