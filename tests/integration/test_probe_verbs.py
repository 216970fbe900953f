"""The CLI grammar against a live training process: backtrace, eval, query, tables, report."""

from __future__ import annotations

import json
import re
import sys

import pytest
from helpers import script, td_run


@pytest.fixture(scope="module")
def live(shared_launch):
    """One training run that every test here questions (each leaves it training), at 50 steps
    a second or fewer (--pause 0.02): at full pace it would take half a core for the module's
    length, and no test here needs more than 30 steps."""
    run = shared_launch(td_run(script("trainer.py"), "--pause", "0.02"))
    run.wait_probe()
    run.wait_steps(1)
    yield run
    assert run.stop() == 0, run.output()


def test_backtrace_text_and_json(live) -> None:
    out = live.cli(str(live.pid), "backtrace")
    assert out.returncode == 0, out.stderr
    assert "MainThread (main)" in out.stdout
    assert "trainer.py" in out.stdout
    # The runner's own frames are not shown: the stack ends in the script, as with python.
    assert "cli/script.py" not in out.stdout
    out = live.cli(str(live.pid), "backtrace", "--format", "json")
    rows = json.loads(out.stdout)
    main = [r for r in rows if r["is_main"]]
    assert main[0]["depth"] == 0
    assert main[-1]["func"] == "<module>" and main[-1]["file"].endswith("trainer.py")
    assert not any(r["thread_name"].startswith("torchdoctor-") for r in rows)


def test_eval_prints_output_value_and_errors(live) -> None:
    out = live.cli(str(live.pid), "eval", "print('hello from eval')\nanswer = 41\nanswer + 1")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "hello from eval\n42\n"
    # Assignments persist in __main__.
    assert live.cli(str(live.pid), "eval", "answer").stdout.strip() == "41"
    out = live.cli(str(live.pid), "eval", "1 / 0")
    assert out.returncode == 1
    assert "ZeroDivisionError" in out.stderr
    out = live.cli(str(live.pid), "eval", "raise SystemExit(5)")
    assert out.returncode == 1 and "SystemExit" in out.stderr
    out = live.cli(str(live.pid), "eval", "def broken(:")
    assert out.returncode == 1 and "SyntaxError" in out.stderr
    # The training went on through all of it, and eval output stayed out of its stdout.
    before = live.steps()
    live.wait_steps(before + 2)
    assert "hello from eval" not in live.stdout()


def test_eval_reads_code_from_stdin(live) -> None:
    out = live.cli(str(live.pid), "eval", "-", input="print(type(model).__name__)")
    assert out.stdout.strip() == "Sequential"


def test_query_formats(live) -> None:
    sql = "SELECT thread_id, name, is_main FROM python.threads ORDER BY is_main DESC"
    table = live.cli(str(live.pid), "query", sql)
    assert table.returncode == 0 and "MainThread" in table.stdout and "(" in table.stdout
    rows = json.loads(live.cli(str(live.pid), "query", sql, "--format", "json").stdout)
    assert rows[0]["name"] == "MainThread" and rows[0]["is_main"] is True
    csv = live.cli(str(live.pid), "query", sql, "--format", "csv").stdout.splitlines()
    assert csv[0] == "thread_id,name,is_main"


def test_bad_sql_is_a_target_error(live) -> None:
    out = live.cli(str(live.pid), "query", "SELEC nonsense")
    assert out.returncode == 1
    assert "syntax error" in out.stderr.lower()
    assert "Traceback" not in out.stderr
    out = live.cli(str(live.pid), "query", "SELECT * FROM python.no_such_table")
    assert out.returncode == 1 and "no_such_table" in out.stderr


def test_tables_lists_schemas_and_columns(live) -> None:
    out = live.cli(str(live.pid), "tables", "--format", "json")
    tables = {t["name"]: t for t in json.loads(out.stdout)}
    assert {"backtrace", "threads", "steps", "torch_trace", "diagnoses"} <= set(tables)
    cols = [c["name"] for c in tables["backtrace"]["columns"]]
    assert cols[:7] == ["thread_id", "thread_name", "depth", "func", "file", "lineno", "code"]
    text = live.cli(str(live.pid), "tables").stdout
    assert "python.threads" in text


def test_report_of_a_live_process(live) -> None:
    live.wait_steps(30)
    out = live.cli(str(live.pid), "report", "--format", "json")
    assert out.returncode == 0, out.stderr
    digest = json.loads(out.stdout)
    assert digest["summary"]["steps"] >= 30
    assert digest["meta"]["pid"] == live.pid
    assert digest["modules"]["items"], "module times of the traced steps"
    page = live.cwd / "live.html"
    out = live.cli(str(live.pid), "report", "-o", str(page))
    assert out.returncode == 0, out.stderr
    found = re.search(r'<script type="application/json" id="td-digest">(.*?)</script>',
                      page.read_text(), re.S)  # fmt: skip
    assert found is not None, "no digest in the page"
    assert json.loads(found.group(1))["summary"]["steps"] >= digest["summary"]["steps"]


def test_usage_and_connection_errors(env) -> None:
    from helpers import cli

    assert cli("999999", "backtrace", env=env).returncode == 2
    out = cli(str(__import__("os").getpid()), "backtrace", env=env)
    assert out.returncode == 2 and "not probed" in out.stderr
    assert cli("backtrace", env=env).returncode == 2  # nobody probed: say how to start
    assert cli("nonsense-verb", env=env).returncode == 2
    assert cli("1234", "frobnicate", env=env).returncode == 2
    assert cli("query", env=env).returncode == 2
    out = cli("--help", env=env)
    assert out.returncode == 0 and "backtrace" in out.stdout


def test_console_script_is_installed() -> None:
    import subprocess
    from pathlib import Path

    exe = Path(sys.executable).parent / "torchdoctor"
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("torchdoctor ")
