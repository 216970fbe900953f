"""`eval` at a step boundary: the seed's gradient scan, which reads `p.grad` twice, sent
hundreds of times against a fast loop that sets the gradients to None at every step, never
trips over the training thread; a stalled training is answered at once, on the probe thread.

On the probe's thread (`--at now`) the same scan fails within a few dozen requests here: a
TypeError when `.grad` became None between the two reads, or a crash of the training process
(torch's tensors are not thread-safe: backward() replaces `.grad` without the GIL)."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest
from helpers import script, td_run, wait_for

from torchdoctor.cli.client import Address, ProbeClient
from torchdoctor.cli.errors import CliError

SCAN = (
    "[n for n, p in model.named_parameters() if p.grad is not None and torch.isinf(p.grad).any()]"
)
REQUESTS = 200


@pytest.mark.slow
def test_eval_runs_between_steps_and_at_once_when_stalled(launch) -> None:
    run = launch(td_run(script("grad_race.py")))
    entry = run.wait_probe()
    client = ProbeClient(Address("test", socket_path=entry["socket"]))
    run.wait_steps(5)

    after: list[int] = []
    for _ in range(REQUESTS):
        status, answer = client.request("POST", "/v1/eval", {"code": SCAN})
        assert status == 200, answer["error"]
        assert answer["value"] == "[]"
        ran = answer["ran"]
        assert ran["where"] == "step", ran
        assert ran["note"] == f"ran at the step boundary after step {ran['after_step']}"
        after.append(ran["after_step"])
    assert after == sorted(after) and after[-1] > after[0]  # the training kept stepping

    # The CLI: the code's output on stdout, where it ran on stderr, nothing in the script's.
    out = run.cli(str(run.pid), "eval", "print('from eval'); type(model).__name__")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "from eval\n'Sequential'\n"
    assert out.stderr.startswith("# ran at the step boundary after step ")
    with pytest.raises(CliError, match="at must be one of auto, step, now"):  # a 400
        client.request("POST", "/v1/eval", {"code": "1", "at": "sometimes"})

    # Stalled: no step boundary comes. auto answers on the probe thread; once the last step
    # is older than the wait, at once (without queueing).
    Path(run.cwd / "stall").touch()
    wait_for(lambda: "stalled" in run.stdout(), what="the training to stall")
    notes = []
    for _ in range(2):
        status, answer = client.request("POST", "/v1/eval", {"code": "step"})
        assert status == 200, answer["error"]
        assert answer["ran"]["where"] == "probe"
        notes.append(answer["ran"]["note"])
    assert all(n.startswith("ran on the probe thread: training not stepping") for n in notes)
    assert "(no step for " in notes[1], notes
    out = run.cli(str(run.pid), "eval", "--at", "now", "--format", "json", "step")
    assert json.loads(out.stdout)["ran"]["note"] == "ran on the probe thread (--at now)"

    # Ctrl-C while an eval holds the training thread is the training's, as it would be without
    # torchdoctor: the script ends with its KeyboardInterrupt, the eval is told.
    Path(run.cwd / "stall").unlink()
    answers: list[tuple[int, dict]] = []
    sleeper = {"code": "import time; time.sleep(60)", "at": "step"}
    asker = threading.Thread(
        target=lambda: answers.append(client.request("POST", "/v1/eval", sleeper))
    )
    asker.start()

    def sleeping_in_eval() -> bool:
        _status, frames = client.request("GET", "/v1/backtrace")
        cols = frames["columns"]
        rows = [dict(zip(cols, r, strict=True)) for r in frames["rows"]]
        return any(r["file"] == "<torchdoctor-eval>" and r["is_main"] for r in rows)

    wait_for(sleeping_in_eval, what="the eval to run on the training thread")
    run.proc.send_signal(signal.SIGINT)
    assert run.wait() != 0
    assert "\nKeyboardInterrupt\n" in run.stderr(), run.stderr()
    assert "<torchdoctor-eval>" not in run.stderr()  # the eval's own frames stay its own
    asker.join(30)
    assert answers and answers[0][0] == 422 and "interrupted" in answers[0][1]["error"]
    assert "from eval" not in run.stdout()
