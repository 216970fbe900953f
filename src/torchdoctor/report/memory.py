"""`torchdoctor memory` as text: the census, memory by phase, the modules that added most, and
the out-of-memory report. The data comes from torchdoctor.memory.view (JSON: print it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchdoctor.diagnose.evidence import decode
from torchdoctor.diagnose.oom import OomDiagnosisEvidence
from torchdoctor.memory.estimate import Breakdown, Situation
from torchdoctor.memory.phases import PhaseMemory
from torchdoctor.memory.view import Census, MemoryView
from torchdoctor.units import human

_KIND_LABELS = {
    "parameter": "parameters",
    "gradient": "gradients",
    "optimizer_state": "optimizer state",
    "buffer": "buffers",
    "activation": "activations",
    "other": "other tensors",
}
_BREAKDOWN = (
    ("parameters", "parameter"),
    ("gradients", "gradient"),
    ("optimizer_state", "optimizer_state"),
    ("buffers", "buffer"),
    ("activations", "activation"),
    ("other", "other"),
)
VIEWER = "https://pytorch.org/memory_viz"


def _grid(rows: Sequence[Sequence[str]], right: Sequence[int] = (), indent: str = "  ") -> str:
    if not rows:
        return ""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append(indent + "  ".join(cells).rstrip())
    return "\n".join(lines)


def _signed(n: Any) -> str:
    if n is None:
        return "-"
    return ("+" if n > 0 else "") + human(n)


def render_view(view: MemoryView) -> str:
    out: list[str] = []
    for record in view.oom:
        evidence = decode("oom", record.evidence)
        if isinstance(evidence, OomDiagnosisEvidence):
            out.append(render_oom(evidence, record.fix, False))
        out.append("")
    if view.census is not None:
        out.extend(render_census(view.census))
        out.append("")
    out.append(render_phases(view.phases))
    if view.modules:
        out.append("")
        out.append(f"modules whose forward added most (step {view.traced_step})")
        rows = [["module", "type", "calls", "added", "after"]]
        for m in view.modules:
            rows.append([m.module, m.type, str(m.calls), _signed(m.added), human(m.after)])
        out.append(_grid(rows, right=(2, 3, 4)))
    last = view.last_step
    if last is not None:
        out.append("")
        out.append(
            f"after step {last.step}: allocated {human(last.allocated)}, peak "
            f"{human(last.max_allocated)}, reserved {human(last.reserved)}, "
            f"rss {human(last.rss)}"
        )
    if not view.oom and not view.live:
        out.append("")
        out.append("no out-of-memory error in this run")
    return "\n".join(line for line in out).strip() + "\n"


def shard_note(held: int, total: int | None, world: int | None) -> str:
    """ "local shard of 2.64 KiB total (world 4)" where a rank holds part of a sharded whole."""
    if not world or total is None or total == held:
        return ""
    return f"local shard of {human(total)} total (world {world})"


def render_census(census: Census) -> list[str]:
    """The census by kind (a sharded model: each rank's part of the whole), the largest
    tensors, and what the largest FSDP2 unit's all-gather materialises."""
    world = census.world
    where = f" on this rank (world {world})" if world else ""
    out = [f"tensors now ({human(census.total)} in all{where}; shared storage counted once)"]
    rows = [["kind", "tensors", "bytes", ""]]
    for e in census.by_kind:
        note = shard_note(e.bytes, e.total, e.world)
        rows.append([_KIND_LABELS[e.kind], str(e.tensors), human(e.bytes), note])
    out.append(_grid(rows, right=(1, 2)))
    units = census.units
    if units:
        unit = units[0]
        others = f" (the largest of {len(units)} units)" if len(units) > 1 else ""
        now = f"; held whole now: {human(unit.gathered)}" if unit.gathered else ""
        out.append(
            f"  FSDP2 all-gather: unit {unit.unit} materialises {human(unit.unsharded)} "
            f"of parameters whole in its forward and backward{others}{now}"
        )
    if census.largest:
        out.append("")
        out.append("largest tensors")
        rows = [["kind", "name", "shape", "dtype", "device", "bytes", ""]]
        for r in census.largest:
            rows.append(
                [
                    r.kind,
                    r.name or (f"({r.grad_fn})" if r.grad_fn else "-"),
                    str(r.shape),
                    str(r.dtype),
                    str(r.device),
                    human(r.bytes),
                    shard_note(r.bytes, r.total_bytes, r.world),
                ]
            )
        out.append(_grid(rows, right=(5,)))
    return out


def render_phases(phases: Sequence[PhaseMemory]) -> str:
    if not phases:
        return "memory by phase: no traced step yet (one step in --trace-every is traced)"
    stepped = [p for p in phases if p.phase != "setup"]
    step = stepped[0].step if stepped else None
    title = "memory by phase"
    if step is not None:
        title += f" (step {step}, the last traced step)"
    rows = [["phase", "allocated", "added", "peak so far", "reserved"]]
    for p in phases:
        mark = "  <- highest" if p.peak else ""
        rows.append(
            [
                p.phase,
                human(p.allocated),
                _signed(p.added),
                human(p.max_allocated),
                human(p.reserved) + mark,
            ]
        )
    return title + "\n" + _grid(rows, right=(1, 2, 3))


def render_oom(
    evidence: OomDiagnosisEvidence, fixes: Sequence[str] = (), phases: bool = True
) -> str:
    """The full out-of-memory report of one `oom` diagnosis (`phases`: with the memory by
    phase of the last traced step before it)."""
    device = str(evidence.device or "?")
    head = "CUDA out of memory" if device.startswith("cuda") else f"Out of memory ({device})"
    step = evidence.step
    where = ""
    if evidence.module:
        kind = evidence.module_type
        where = f", in the {evidence.phase} of {evidence.module}"
        where += f" ({kind})" if kind else ""
    elif evidence.phase:
        where = f", in the {evidence.phase} phase"
    out = [f"{head}{' at step ' + str(step) if step is not None else ''}{where}"]
    situation = evidence.situation or Situation()
    memory = evidence.memory or {}
    rows = [["asked for", human(evidence.asked)]]
    if situation.available is not None:
        avail = human(situation.available)
        if situation.capacity:
            avail += f" of {human(situation.capacity)}"
        if memory.get("limited_by"):
            avail += f" (limited by {memory['limited_by']})"
        rows.append(["available", avail])
    if device.startswith("cuda"):
        reserved = memory.get("reserved_at_failure", memory.get("reserved"))
        allocated = memory.get("allocated_at_failure", memory.get("allocated"))
        rows.append(["allocated", human(allocated)])
        rows.append(["reserved", human(reserved)])
        if memory.get("fraction") not in (None, 1.0):
            rows.append(
                ["per-process cap", f"{memory['fraction']:.0%} of {human(memory['total'])}"]
            )
    elif memory.get("rss") is not None:
        rows.append(["process RSS", human(memory["rss"])])
    if evidence.file:
        note = f" ({evidence.location_note})" if evidence.location_note else ""
        rows.append(["where", f"{evidence.file}:{evidence.line}{note}"])
    if situation.batch_size:
        rows.append(["batch size", str(situation.batch_size)])
    if evidence.message:
        rows.append(["message", str(evidence.message)[:400]])
    out.append(_grid(rows))

    breakdown = evidence.breakdown or Breakdown()
    counts = evidence.counts or {}
    sharding = evidence.sharding
    world = sharding.world if sharding else None
    whole = sharding.total if sharding else {}
    out.append("")
    on_rank = f", this rank of {world}" if world and world > 1 else ""
    out.append(f"held when it failed ({device}{on_rank})")
    rows = [["", "bytes", "tensors", ""]]
    for key, kind in _BREAKDOWN:
        count = str(counts.get(kind, 0))
        held = getattr(breakdown, key) or 0
        note = shard_note(held, whole.get(kind), world) if world and world > 1 else ""
        rows.append([_KIND_LABELS[kind], human(held), count, note])
    units = sharding.units if sharding else []
    if units:
        unit = units[0]
        note = f"unit {unit.name} whole, in its forward and backward (FSDP2)"
        rows.append(["all-gather peak", human(unit.unsharded), "", note])
    if breakdown.cached_unused is not None:
        note = "reserved by PyTorch, not allocated (fragmentation)"
        rows.append(["cached but unused", human(breakdown.cached_unused), "", note])
    if evidence.not_in_tensors is not None:
        what = (
            "allocated, but no live tensor found for it"
            if device.startswith("cuda")
            else "the rest of the process: Python, libraries, caches"
        )
        rows.append(["not in tensors", human(evidence.not_in_tensors), "", what])
    out.append(_grid(rows, right=(1, 2)))

    tops = evidence.top_tensors or []
    if tops:
        out.append("")
        out.append("largest tensors")
        rows = [["kind", "name", "shape", "dtype", "bytes"]]
        for t in tops[:8]:
            rows.append(
                [
                    t.kind,
                    t.name or (f"({t.grad_fn})" if t.grad_fn else "-"),
                    str(tuple(t.shape)),
                    t.dtype,
                    human(t.bytes),
                ]
            )
        out.append(_grid(rows, right=(4,)))
    if phases and evidence.phases:
        out.append("")
        out.append(render_phases(evidence.phases))
    listed = list(fixes) or [f.text for f in evidence.fixes or []]
    if listed:
        out.append("")
        missing = evidence.shortfall
        short = f" (short by {human(missing)})" if missing else ""
        out.append(f"fixes, the biggest estimated saving first{short}")
        for i, text in enumerate(listed, 1):
            out.append(f"  {i}. {text}")
    if evidence.snapshot:
        out.append("")
        out.append(f"allocator snapshot: {evidence.snapshot} (open it at {VIEWER})")
    return "\n".join(out)
