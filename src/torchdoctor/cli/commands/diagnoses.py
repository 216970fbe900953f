"""`torchdoctor ENDPOINT diagnoses` (live) or `torchdoctor diagnoses RUN_DIR` (saved)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report import formats
from torchdoctor.report.diagnoses import render_full
from torchdoctor.store.saved import JobRun
from torchdoctor.store.schema import DIAGNOSES

_COLUMNS = DIAGNOSES.column_names

NAME = "diagnoses"
SUMMARY = "the problems found in a run, with evidence and ranked fixes"
TARGET = "optional"
FORMATS = formats.REPORT


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a run or job directory (for a saved run)")


def main(args: Any, ctx: Any) -> int:
    if args.source is not None:
        if ctx.endpoint is not None:
            raise CliError("give either an ENDPOINT or a RUN_DIR, not both")
        from torchdoctor.cli.saved import open_saved

        run = open_saved(args.source, ctx)
        if isinstance(run, JobRun):
            records = _job_findings(run)
            if args.format != "json":
                from torchdoctor.report.cluster import render_diagnoses

                ctx.print(render_diagnoses(records, {}))
                return OK
        else:
            records = run.block("diagnoses").to_records()
            for r in records:
                r["evidence"] = _evidence(r.get("evidence"))
    else:
        status, payload = ctx.client().request("GET", "/v1/diagnoses")
        if status != 200:
            ctx.warn(f"torchdoctor: {payload.get('error')}")
            return TARGET_ERROR
        records = [dict(zip(payload["columns"], row, strict=True)) for row in payload["rows"]]
        for r in records:
            r["evidence"] = _evidence(r.get("evidence"))
    if args.format == "json":
        ctx.print(json.dumps(records, indent=2))
    else:
        ctx.print(render_full(records))
    return OK


def _job_findings(run: Any) -> list[dict[str, Any]]:
    """The job-level diagnoses of a job directory computed now (the ranks that died could not
    report them) merged with those the ranks reported: each job-level finding once, then the
    ranks' own findings."""
    from torchdoctor.cluster.saved import findings
    from torchdoctor.diagnose import job_kinds
    from torchdoctor.report.cluster import merge_findings

    fresh = []
    for d in findings(run):
        record = dict(zip(_COLUMNS, d.row(), strict=True))
        record["evidence"] = _evidence(record["evidence"])
        fresh.append(record)
    # Who reported each row: the rank directory it is in (a job-level row's `rank` is the rank
    # it is about).
    reported: list[tuple[int | None, dict[str, Any]]] = []
    for rank in run.ranks:
        for record in run.rank_run(rank).block("diagnoses").to_records():
            record["evidence"] = _evidence(record.get("evidence"))
            reported.append((rank, record))
    return merge_findings(reported, fresh, job_kinds(), fresh_first=False)


def _evidence(text: Any) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return text
