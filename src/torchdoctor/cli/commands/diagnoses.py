"""`torchdoctor ENDPOINT diagnoses` (live) or `torchdoctor diagnoses RUN_DIR` (saved)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from torchdoctor.cli.errors import OK, TARGET_ERROR, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.context import Context
    from torchdoctor.diagnose.record import Finding
    from torchdoctor.store.saved import JobRun

NAME = "diagnoses"
SUMMARY = "the problems found in a run, with evidence and ranked fixes"
TARGET = "optional"
FORMATS = formats.REPORT


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a run or job directory (for a saved run)")


def main(args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.diagnose.record import Finding
    from torchdoctor.report import renderer
    from torchdoctor.store.saved import JobRun

    shown = renderer.of(args.format)
    if args.source is not None:
        if ctx.endpoint is not None:
            raise CliError("give either an ENDPOINT or a RUN_DIR, not both")
        from torchdoctor.cli.saved import open_saved

        run = open_saved(args.source, ctx)  # warns of the parts that failed while it recorded
        failures = run.failures

        def steps() -> int:
            return run.block("steps").rows

        if isinstance(run, JobRun):
            findings = _job_findings(run)
            if args.format != "json":
                shown = renderer.JobTextRenderer()
        else:
            findings = [Finding.from_row(r) for r in run.block("diagnoses").to_records()]
    else:
        status, payload = ctx.client().request("GET", "/v1/diagnoses")
        if status != 200:
            ctx.warn(f"torchdoctor: {payload.get('error')}")
            return TARGET_ERROR
        rows = [dict(zip(payload["columns"], row, strict=True)) for row in payload["rows"]]
        findings = [Finding.from_row(r) for r in rows]
        failures = [str(f) for f in payload.get("failures") or []]  # an older probe sends none
        for failure in failures:
            ctx.warn(f"torchdoctor: in the running process, {failure}")

        def steps() -> int:
            return _live_steps(ctx)

    ctx.print(renderer.render_judged(shown, findings, steps, failures))
    return OK


def _live_steps(ctx: Context) -> int:
    """The steps a live process has recorded (taken as some where the query fails: its
    findings are then shown as they are)."""
    status, payload = ctx.client().request(
        "POST", "/v1/query", {"sql": "SELECT count(*) AS n FROM python.steps"}
    )
    if status != 200 or not payload.get("rows"):
        return 1
    return int(payload["rows"][0][0])


def _job_findings(run: JobRun) -> list[Finding]:
    """The job-level diagnoses of a job directory computed now (the ranks that died could not
    report them) merged with those the ranks reported: each job-level finding once, then the
    ranks' own findings."""
    from torchdoctor.cluster.saved import findings
    from torchdoctor.diagnose import job_kinds
    from torchdoctor.diagnose.record import Finding
    from torchdoctor.report.cluster import merge_findings

    fresh = [Finding.of(d) for d in findings(run)]
    # Who reported each row: the rank directory it is in (a job-level row's `rank` is the rank
    # it is about).
    reported: list[tuple[int | None, Finding]] = []
    for rank in run.ranks:
        for record in run.rank_run(rank).block("diagnoses").to_records():
            reported.append((rank, Finding.from_row(record)))
    return merge_findings(reported, fresh, job_kinds(), fresh_first=False)
