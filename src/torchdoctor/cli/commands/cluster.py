"""`torchdoctor [ENDPOINT] cluster list|backtrace|query|diagnoses`: every rank of a distributed
job at once, from any one rank's endpoint.

The rank named (or, with none named, a rank of the one job probed on this machine) tells where
the others are: their entries in the job's own c10d store. Ranks registered in this user's
socket directory here are asked over their Unix sockets, the others over their TCP endpoints
with their tokens. A rank that cannot be asked is listed with the reason, never left out.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from torchdoctor import _json
from torchdoctor.cli.errors import OK, TARGET_ERROR, USAGE, CliError
from torchdoctor.report import formats

if TYPE_CHECKING:
    from torchdoctor.cli.client import ProbeClient
    from torchdoctor.cli.context import Context

NAME = "cluster"
SUMMARY = "every rank of a distributed job: cluster list|backtrace|query SQL|diagnoses"
TARGET = "live"
FORMATS = False
DEFAULT_TIMEOUT = 10.0
JOB_ROWS, MIN_ROWS, MAX_ROWS = 16384, 64, 512  # rows per table asked of each rank, in all


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sub", metavar="SUBVERB", required=True)
    p = sub.add_parser("list", help="every rank: node, pid, endpoint, step, or why unreachable")
    formats.add(p, formats.ROWS)
    p = sub.add_parser("backtrace", help="main-thread stacks, ranks with the same one grouped")
    formats.add(p, formats.REPORT)
    p = sub.add_parser("query", help="SQL on every rank, rows unioned with their rank")
    p.add_argument("sql", help="the query; tables are python.<name>; '-' reads stdin")
    formats.add(p, formats.ROWS)
    p = sub.add_parser("diagnoses", help="every rank's diagnoses and the job-level ones")
    formats.add(p, formats.REPORT)


@dataclasses.dataclass
class Job:
    info: dict[str, Any]  # the asked rank's /v1/cluster/peers answer
    peers: list[Any]  # cluster.peers.Peer per rank

    @property
    def world_size(self) -> int:
        return int(self.info["world_size"])


def main(args: argparse.Namespace, ctx: Context) -> int:
    job = open_job(ctx)
    handler = {"list": _list, "backtrace": _backtrace, "query": _query, "diagnoses": _diagnoses}
    return int(handler[args.sub](job, args, ctx))


# -- finding the job ----------------------------------------------------------------------------
def open_job(ctx: Context) -> Job:
    from torchdoctor.cluster.peers import route
    from torchdoctor.cluster.transport import Target

    if ctx.endpoint is None:
        client, info = _any_rank(ctx)
    else:
        client = ctx.client()
        info = _peers_of(client)
    entries = {int(r): e for r, e in (info.get("entries") or {}).items()}
    peers = [route(r, entries.get(r), ctx.token) for r in range(int(info["world_size"]))]
    asked = client.address
    me = peers[int(info["rank"])]
    me.target = Target(
        asked.label, asked.socket_path, asked.host, asked.port, asked.token
    )  # the way the user named it works, whatever the entry says
    me.reason = None
    if info.get("store_error"):
        ctx.warn(
            f"torchdoctor: the job's store at {info.get('store')} cannot be read "
            f"({info['store_error']}); ranks seen before are used"
        )
    return Job(info, peers)


def _peers_of(client: ProbeClient) -> dict[str, Any]:
    status, payload = client.request("GET", "/v1/cluster/peers")
    if status != 200:
        raise CliError(f"{client.address.label}: {payload.get('error')}")
    return dict(payload)


def _any_rank(ctx: Context) -> tuple[Any, dict[str, Any]]:
    """With no ENDPOINT: a rank of the one distributed job probed on this machine."""
    from torchdoctor import registry
    from torchdoctor.cli.client import Address, ProbeClient

    try:
        entries = registry.entries()
    except registry.InsecureDirectory as exc:
        raise CliError(str(exc)) from None
    jobs: dict[tuple[Any, ...], tuple[Any, dict[str, Any]]] = {}
    for entry in entries:
        address = Address(label=f"process {entry['pid']}", socket_path=entry["socket"])
        client = ProbeClient(address, timeout=2.0)
        try:
            status, info = client.request("GET", "/v1/cluster/peers")
        except CliError:
            continue
        if status == 200:
            key = (info.get("store"), info.get("job"), info.get("world_size"))
            jobs.setdefault(key, (client, info))
    if not jobs:
        raise CliError(
            "no rank of a distributed job is probed here (torch.distributed initialised under "
            "torchdoctor); name one: torchdoctor ENDPOINT cluster ..."
        )
    if len(jobs) > 1:
        listing = "\n".join(
            f"  {c.address.label}: job {k[1] or '?'} (store {k[0]}, {k[2]} ranks)"
            for k, (c, _) in jobs.items()
        )
        raise CliError(f"ranks of several jobs are probed here; name one (pid):\n{listing}")
    return next(iter(jobs.values()))


def _fan_out(job: Job, ctx: Context, method: str, path: str, body: Any = None) -> dict[int, Any]:
    from torchdoctor.cluster.fanout import fan_out

    return fan_out(job.peers, method, path, body, ctx.timeout or DEFAULT_TIMEOUT)


def _warn_unreachable(answers: dict[int, Any], ctx: Context) -> dict[int, str]:
    lost = {r: str(a.reason) for r, a in answers.items() if a.reason is not None}
    for rank, reason in lost.items():
        ctx.warn(f"torchdoctor: rank {rank} unreachable: {reason}")
    return lost


def _none_answered(answers: dict[int, Any]) -> None:
    if all(a.reason is not None for a in answers.values()):
        raise CliError("no rank of the job could be reached")


# -- sub-verbs ------------------------------------------------------------------------------
def _list(job: Job, args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.report.tabular import render

    answers = _fan_out(job, ctx, "POST", "/v1/cluster/state", {"rows": 0})
    records = []
    for peer in job.peers:
        answer = answers[peer.rank]
        record = peer.describe()
        state = answer.payload if answer.ok else {}
        record.update(
            step=state.get("steps_done"),
            phase=state.get("phase"),
            status="ok" if answer.ok else "unreachable",
            reason=None if answer.ok else answer.reason,
        )
        records.append(record)
    if args.format == "json":
        info = {k: job.info.get(k) for k in ("job", "world_size", "store")}
        ctx.print(_json.dumps({**info, "ranks": records}, indent=2))
        return OK
    columns = ["rank", "node", "pid", "endpoint", "step", "phase", "status", "reason"]
    if args.format == "table":
        ctx.print(
            f"job {job.info.get('job') or '?'}: {job.world_size} ranks, "
            f"store {job.info.get('store') or '?'}"
        )
    ctx.print(render(columns, [[r.get(c) for c in columns] for r in records], args.format))
    return OK


def _backtrace(job: Job, args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.report import cluster as report

    answers = _fan_out(job, ctx, "GET", "/v1/backtrace")
    _none_answered(answers)
    lost = {r: str(a.reason) for r, a in answers.items() if a.reason is not None}
    ok = {r: a.payload for r, a in answers.items() if a.ok}
    if args.format == "json":
        ranks = {
            str(r): [dict(zip(p["columns"], row, strict=True)) for row in p["rows"]]
            for r, p in ok.items()
        }
        unreachable = {str(r): reason for r, reason in lost.items()}
        ctx.print(_json.dumps({"ranks": ranks, "unreachable": unreachable}, indent=2))
        return OK
    stacks = {r: report.main_stacks(p["columns"], p["rows"]) for r, p in ok.items()}
    ctx.print(report.render_backtrace(report.group_stacks(stacks), lost))
    return OK


def _query(job: Job, args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.report.tabular import render

    sql = _read_sql(args.sql)
    answers = _fan_out(job, ctx, "POST", "/v1/query", {"sql": sql, "timeout": ctx.timeout})
    _none_answered(answers)
    _warn_unreachable(answers, ctx)
    columns: list[str] | None = None
    rows: list[list[Any]] = []
    failed = False
    for rank, answer in answers.items():
        if answer.reason is not None:
            continue
        if answer.status != 200:
            ctx.warn(f"torchdoctor: rank {rank}: query failed: {answer.payload.get('error')}")
            failed = True
            continue
        got = list(answer.payload["columns"])
        own_rank = "rank" in got
        if columns is None:
            columns = got if own_rank else ["rank", *got]
        for row in answer.payload["rows"]:
            rows.append(list(row) if own_rank else [rank, *row])
        if answer.payload.get("truncated"):
            ctx.warn(f"torchdoctor: rank {rank}: only the first rows came back; add a LIMIT")
    if columns is None:
        return TARGET_ERROR
    ctx.print(render(columns, rows, args.format))
    return TARGET_ERROR if failed else OK


def _read_sql(text: str) -> str:
    if text == "-":
        import sys

        return sys.stdin.read()
    return text


def _diagnoses(job: Job, args: argparse.Namespace, ctx: Context) -> int:
    from torchdoctor.cluster import gather
    from torchdoctor.diagnose import job_kinds, job_modules
    from torchdoctor.diagnose.inputs import Inputs
    from torchdoctor.diagnose.record import Finding
    from torchdoctor.report import cluster as report
    from torchdoctor.report import renderer
    from torchdoctor.store.columns import Block
    from torchdoctor.store.schema import BY_NAME

    # One request per rank: its findings and its recent rows, from which the job-level
    # diagnoses are computed as of now; a window that shrinks as ranks grow (the straggler
    # needs tens of steps, the hold-ups only the pending calls).
    rows = max(MIN_ROWS, min(MAX_ROWS, JOB_ROWS // max(1, job.world_size)))
    body = {"rows": rows, "findings": True}
    states = _fan_out(job, ctx, "POST", "/v1/cluster/state", body)
    _none_answered(states)
    lost = {r: str(a.reason) for r, a in states.items() if a.reason is not None}
    reported: list[tuple[int | None, Finding]] = []
    kept: dict[int, gather.RankRecord] = {}
    for rank, answer in states.items():
        heard = kept[rank] = gather.RankRecord(rank)
        heard.entry = answer.peer.entry
        if not answer.ok:
            heard.lost(answer.reason or f"HTTP {answer.status}", answer.gone)
            continue
        heard.update(answer.payload)
        found = answer.payload.get("diagnoses") or {"columns": [], "rows": []}
        for row in found["rows"]:
            reported.append((rank, Finding.from_row(dict(zip(found["columns"], row, strict=True)))))
    timeouts = [float(a.payload["hang_timeout"]) for a in states.values() if a.ok]
    view = gather.job_inputs(kept, job.world_size, min(timeouts) if timeouts else 60.0)
    inputs = Inputs(
        steps=Block.empty(BY_NAME["steps"]),
        module_grads=Block.empty(BY_NAME["module_grads"]),
        events=[],
        config=None,
        now=view.now,
        job=view,
    )
    fresh = [Finding.of(d) for module in job_modules() for d in module.diagnose(inputs)]
    findings = report.merge_findings(reported, fresh, job_kinds())
    shown = renderer.JsonRenderer() if args.format == "json" else renderer.JobTextRenderer(lost)
    ctx.print(shown.render(findings))
    return OK if findings or not lost else USAGE
