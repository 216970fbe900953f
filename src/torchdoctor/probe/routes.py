"""The probe's endpoints. Each takes the request as a dict and returns (status, JSON object).

Status 422 means the target ran the request and reported an error (bad SQL, an exception in
eval): the CLI exits 1 on it. 400 is a malformed request: the CLI exits 2.
"""

from __future__ import annotations

from typing import Any, Protocol

from torchdoctor._json import clean
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


def _bad(message: str) -> tuple[int, dict[str, Any]]:
    return 400, {"error": message}


def build_routes(app: ProbeApp) -> Routes:
    routes = Routes()

    def status(_req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, clean(app.status())

    def backtrace(_req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        spec = BY_NAME["backtrace"]
        rows = backtrace_rows()
        return 200, {"columns": list(spec.column_names), "rows": clean(rows)}

    def eval_(req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        code = req.get("code")
        if not isinstance(code, str):
            return _bad("eval needs a 'code' string")
        result = evaluate(code)
        payload = {"output": result.output, "value": result.value, "error": result.error}
        return (422 if result.error else 200), payload

    def query(req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        sql = req.get("sql")
        if not isinstance(sql, str):
            return _bad("query needs an 'sql' string")
        try:
            timeout = float(req.get("timeout") or 0) or None
        except (TypeError, ValueError):
            return _bad("timeout must be a number of seconds")
        try:
            result = app.sql.execute(sql, timeout=timeout)
        except SqlError as exc:
            return 422, {"error": str(exc)}
        return 200, {
            "columns": result.columns,
            "types": result.types,
            "rows": clean(result.rows),
            "truncated": result.truncated,
        }

    def tables(_req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"tables": describe_tables(app.table_names())}

    def diagnoses(_req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            result = app.sql.execute("SELECT * FROM python.diagnoses ORDER BY time")
        except SqlError as exc:
            return 422, {"error": str(exc)}
        return 200, {"columns": result.columns, "rows": clean(result.rows)}

    def configure(req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            return 200, clean(app.configure(**req))
        except (TypeError, ValueError) as exc:
            return _bad(str(exc))

    routes.add("GET", "/v1/status", status)
    routes.add("GET", "/v1/backtrace", backtrace)
    routes.add("POST", "/v1/eval", eval_)
    routes.add("POST", "/v1/query", query)
    routes.add("GET", "/v1/tables", tables)
    routes.add("GET", "/v1/diagnoses", diagnoses)
    routes.add("POST", "/v1/config", configure)
    return routes
