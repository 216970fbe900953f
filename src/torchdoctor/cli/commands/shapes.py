"""`torchdoctor [ENDPOINT] shapes` (live) or `torchdoctor shapes RUN_DIR` (saved): the module
tree with the input and output shapes of a real batch, from python.shapes (the first step and
traced steps), with each module's parameter count from python.modules. What torchinfo prints,
without a dummy input."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from torchdoctor._json import dumps
from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context
    from torchdoctor.telemetry.shapes import ModuleParams

NAME = "shapes"
SUMMARY = "the module tree with the shapes, dtypes and devices of a real batch"
TARGET = "optional"

_CALLS = (
    "SELECT step, call, module, type, depth, input_shapes, input_dtypes, input_devices, "
    "output_shapes, output_dtypes, output_devices, raised, rank FROM python.shapes "
    "WHERE step = {step} AND rank = {rank} ORDER BY call"
)
_STEPS = "SELECT DISTINCT step FROM python.shapes WHERE rank = {rank} ORDER BY step"
_MODULES = "SELECT model, name, type, params, trainable FROM python.modules"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a run or job directory (for a saved run)")
    parser.add_argument(
        "--step", type=int, help="the step to show (default: the last one with shapes)"
    )
    parser.add_argument("--rank", type=int, default=0, help="the rank of a job (default 0)")
    parser.add_argument("--format", choices=("text", "json"), default="text")


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.telemetry.shapes import ShapeCall, StepShapes

    if args.source is not None and ctx.endpoint is not None:
        raise CliError("give either an ENDPOINT or a RUN_DIR, not both")
    sql = _Sql(args.source, ctx)
    steps = [int(r["step"]) for r in sql.rows(_STEPS.format(rank=int(args.rank)))]
    if not steps:
        ctx.warn(
            "torchdoctor: no module calls with shapes recorded (yet): they are recorded on the "
            "first step and on traced steps (--trace-every), and not for a torch.compile'd model"
        )
        return TARGET_ERROR
    step = steps[-1] if args.step is None else int(args.step)
    if step not in steps:
        shown = ", ".join(str(s) for s in steps[-10:])
        raise CliError(f"shapes: no shapes for step {step}; steps with shapes: {shown}")
    params = _params(sql.rows(_MODULES))
    calls = [
        ShapeCall.from_row(row, params.get(row["module"]))
        for row in sql.rows(_CALLS.format(step=step, rank=int(args.rank)))
    ]
    data = StepShapes(step=step, rank=int(args.rank), steps=steps, calls=calls)
    if args.format == "json":
        ctx.print(dumps(data, indent=2))
    else:
        from torchdoctor.report.shapes import render_shapes

        ctx.print(render_shapes(data))
    return OK


class _Sql:
    """The same SQL over a live process or a saved run."""

    def __init__(self, source: str | None, ctx: Context) -> None:
        self.ctx = ctx
        self.engine = None
        if source is not None:
            from torchdoctor.cli.saved import open_saved
            from torchdoctor.sql.engine import SqlEngine

            self.engine = SqlEngine(open_saved(source, ctx))

    def rows(self, sql: str) -> list[dict[str, Any]]:
        if self.engine is not None:
            from torchdoctor.sql.engine import SqlError

            try:
                result = self.engine.execute(sql, timeout=self.ctx.timeout)
            except SqlError as exc:
                raise CliError(f"shapes: {exc}", TARGET_ERROR) from None
            columns, rows = result.columns, result.rows
        else:
            status, payload = self.ctx.client().request(
                "POST", "/v1/query", {"sql": sql, "timeout": self.ctx.timeout}
            )
            if status != 200:
                raise CliError(f"shapes: {payload.get('error')}", TARGET_ERROR)
            columns, rows = payload["columns"], payload["rows"]
        return [dict(zip(columns, row, strict=True)) for row in rows]


def _params(rows: list[dict[str, Any]]) -> dict[str, ModuleParams]:
    """Qualified module name -> parameters of its whole subtree (total and trainable), named
    as python.shapes names modules: the model by its label, the first model's modules by their
    plain names, other models' with their label in front."""
    from torchdoctor.telemetry.shapes import ModuleParams

    out: dict[str, list[int]] = {}
    first = rows[0]["model"] if rows else None
    for row in rows:
        model, name = row["model"], row["name"] or ""
        prefix = "" if model == first else f"{model}."
        parts = name.split(".") if name else []
        keys = [model] + [prefix + ".".join(parts[: i + 1]) for i in range(len(parts))]
        for key in keys:
            entry = out.setdefault(key, [0, 0])
            entry[0] += int(row["params"] or 0)
            entry[1] += int(row["trainable"] or 0)
    return {key: ModuleParams(params, trainable) for key, (params, trainable) in out.items()}
