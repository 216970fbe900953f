"""The probe's endpoints. Each takes the request as a dict and returns (status, JSON object).

Status 422 means the target ran the request and reported an error (bad SQL, an exception in
eval): the CLI exits 1 on it. 400 is a malformed request: the CLI exits 2.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from torchdoctor._json import clean
from torchdoctor.probe import activity, eval_at
from torchdoctor.probe.evaluator import evaluate
from torchdoctor.probe.server import Routes
from torchdoctor.sql.engine import SqlEngine, SqlError
from torchdoctor.store.schema import BY_NAME, describe_tables
from torchdoctor.telemetry.stacks import backtrace_rows


class ProbeApp(Protocol):
    sql: SqlEngine

    def status(self) -> dict[str, Any]: ...

    def table_names(self) -> list[str]: ...

    def configure(self, **changes: Any) -> dict[str, Any]: ...

    def failures(self) -> list[str]:
        """The parts of torchdoctor that failed in this process: what its diagnoses miss."""
        ...

    def training(self) -> eval_at.Training | None:
        """The training's step boundary (None until torch is in use)."""
        ...


MAX_QUERY_TIMEOUT = 300.0  # one query holds the SQL engine: not for ever


def _bad(message: str) -> tuple[int, dict[str, Any]]:
    return 400, {"error": message}


def build_routes(app: ProbeApp) -> Routes:
    routes = Routes()

    def status(_req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        out = app.status()
        training = app.training()
        last = training.last if training is not None else None
        out["state"] = activity.state(last)
        if last is not None:
            out["since_step"] = time.time() - last.time
        if out["state"] != activity.STEPPING:  # where it is meanwhile
            out["doing"] = activity.doing(training.train_thread if training else None)
        return 200, clean(out)

    def backtrace(_req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        spec = BY_NAME["backtrace"]
        rows = backtrace_rows()
        return 200, {"columns": list(spec.column_names), "rows": clean(rows)}

    def eval_(req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        code = req.get("code")
        if not isinstance(code, str):
            return _bad("eval needs a 'code' string")
        at = req.get("at") or "auto"
        if at not in eval_at.AT_CHOICES:
            return _bad(f"at must be one of {', '.join(eval_at.AT_CHOICES)}")
        frame = req.get("frame")
        if frame is not None and not isinstance(frame, str):
            return _bad("frame must be a function's name or a frame's number, as a string")
        training = app.training()
        asker = threading.get_ident()

        def run_code() -> Any:
            # On the training thread (a step boundary) its frames are the callers of this
            # call; on ours, the training thread's as they are now.
            me = threading.get_ident()
            thread = me if me != asker else training.train_thread if training else None
            return evaluate(code, thread_id=thread, frame=frame)

        try:
            result, placement = eval_at.run(run_code, at, training)
        except eval_at.NoStepBoundary as exc:
            return 422, {"output": "", "value": None, "error": f"{exc}\n", "ran": None}
        except eval_at.TrainingInterrupted:
            error = "the training was interrupted (Ctrl-C) while the code ran\n"
            return 422, {"output": "", "value": None, "error": error, "ran": None}
        payload = {
            "output": result.output,
            "value": result.value,
            "error": result.error,
            "ran": placement.as_dict(),
            "frames": result.frames(),  # where names that are not __main__'s came from
        }
        return (422 if result.error else 200), payload

    def query(req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        sql = req.get("sql")
        if not isinstance(sql, str):
            return _bad("query needs an 'sql' string")
        try:
            timeout = float(req.get("timeout") or 0) or None
        except (TypeError, ValueError):
            return _bad("timeout must be a number of seconds")
        if timeout is not None and not 0 < timeout <= MAX_QUERY_TIMEOUT:
            return _bad(f"timeout must be more than 0 and at most {MAX_QUERY_TIMEOUT:g} s")
        try:
            result = app.sql.execute(sql, timeout=timeout)
        except SqlError as exc:
            return 422, {"error": str(exc)}
        return 200, {
            "columns": result.columns,
            "types": result.types,
            "rows": result.rows,  # non-finite floats: the server's encoder makes them strings
            "truncated": result.truncated,
        }

    def tables(_req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"tables": describe_tables(app.table_names())}

    def diagnoses(_req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            result = app.sql.execute("SELECT * FROM python.diagnoses ORDER BY time")
        except SqlError as exc:
            return 422, {"error": str(exc)}
        return 200, {"columns": result.columns, "rows": result.rows, "failures": app.failures()}

    def configure(req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            return 200, clean(app.configure(**req))
        except (TypeError, ValueError) as exc:
            return _bad(str(exc))

    routes.add("GET", "/v1/status", status)
    routes.add("GET", "/v1/backtrace", backtrace)
    routes.add("POST", "/v1/eval", eval_)
    routes.add("POST", "/v1/query", query, heavy=True)
    routes.add("GET", "/v1/tables", tables)
    routes.add("GET", "/v1/diagnoses", diagnoses, heavy=True)
    routes.add("POST", "/v1/config", configure)
    return routes
