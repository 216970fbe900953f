"""Every way in ends in the same probe: run, the TORCHDOCTOR=1 start-up hook, start(), attach.
The process is the subject here (its exit code, a live probe, the start-up hook); what is the
CLI's alone runs through its main() in this process (tests/recording.py)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from helpers import script, td_run
from recording import td

from torchdoctor.attach import REGISTERS_REFUSED


def _check_probe(run) -> None:
    run.wait_probe()
    run.wait_steps(2)
    out = run.cli(str(run.pid), "eval", "trainer.current_step > 0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    frames = run.query("SELECT file FROM python.backtrace WHERE is_main")
    assert any(f["file"].endswith("trainer.py") for f in frames), frames


def test_run_keeps_argv_and_exit_code(launch) -> None:
    run = launch(td_run(script("trainer.py"), "--steps", "5", "--exit-code", "3", "--pause", "0"))
    assert run.wait() == 3
    assert "argv=['--steps', '5', '--exit-code', '3', '--pause', '0']" in run.stdout()
    assert "finished" in run.stdout()


def test_run_module_form(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(script("trainer.py"), pkg / "train.py")
    run = td("run", "-m", "mypkg.train", "--steps", "3", "--pause", "0", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "argv=['--steps', '3', '--pause', '0']" in run.stdout


def test_run_script_exception_exits_1_with_traceback(launch, tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nraise ValueError('boom')\n")
    run = launch(td_run(str(bad)))
    assert run.wait() == 1
    assert "ValueError: boom" in run.stderr()
    assert 'bad.py", line 2' in run.stderr()


def test_run_missing_script_is_a_usage_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = td("run", "no_such_script.py", cwd=tmp_path)
    assert run.returncode == 2
    assert "No such file" in run.stderr


def test_run_and_list(launch) -> None:
    run = launch(td_run(script("trainer.py")))
    _check_probe(run)
    # `list` shows the process (the only probe of this test's socket directory)
    out = run.cli("list", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["pid"] for r in rows] == [run.pid]
    assert rows[0]["endpoint"].endswith(f"{run.pid}.sock")
    assert "trainer.py" in rows[0]["command"]
    # With exactly one probed process the ENDPOINT may be left out.
    out = run.cli("eval", "1 + 1")
    assert out.stdout.strip() == "2"
    assert run.stop() == 0


def test_env_var_startup_hook(launch) -> None:
    run = launch([sys.executable, script("trainer.py")], extra_env={"TORCHDOCTOR": "1"})
    _check_probe(run)
    assert run.stop() == 0
    assert run.run_dirs(), "the run directory should be written"


def test_env_var_off_means_off(launch) -> None:
    run = launch(
        [sys.executable, script("trainer.py"), "--steps", "3"], extra_env={"TORCHDOCTOR": "0"}
    )
    assert run.wait() == 0
    assert run.entry() is None
    assert not run.run_dirs()


def test_library_start(launch) -> None:
    run = launch([sys.executable, script("trainer.py"), "--start"])
    _check_probe(run)
    assert run.stop() == 0


@pytest.mark.skipif(not shutil.which("gdb"), reason="attach needs gdb")
def test_attach(launch) -> None:
    run = launch([sys.executable, script("trainer.py")])
    # Wait until the script is training, without any probe: its own output says so.
    from helpers import wait_for

    wait_for(lambda: "step 3 " in run.stdout(), what="the plain script to train")
    assert run.entry() is None
    out = run.cli("attach", str(run.pid))
    if REGISTERS_REFUSED in out.stderr:
        # This machine's kernel refuses gdb's calls (tried on a child first): a clear answer,
        # and the training untouched, exactly as without the attempt
        assert "nothing was done to the process" in out.stderr and out.returncode != 0
        assert run.entry() is None
        assert run.stop() == 0
        return
    assert out.returncode == 0, out.stderr
    assert f"attached to {run.pid}" in out.stdout
    assert "steps are counted from the attach" in out.stdout  # earlier steps exist, unseen
    _check_probe(run)
    assert "since the attach" in run.cli("list").stdout
    again = run.cli("attach", str(run.pid))
    assert again.returncode == 0 and "already probed" in again.stdout
    assert run.stop() == 0


def test_attach_to_missing_process_is_a_usage_error() -> None:
    out = td("attach", "999999")
    assert out.returncode == 2
    assert "no process with pid 999999" in out.stderr
