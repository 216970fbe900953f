"""Every table torchdoctor serves under schema `python`: its columns, their types, what a row is.

The SQL views, the saved format, `torchdoctor tables` and docs/tables.md all come from this one
list. Units are seconds and bytes throughout.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

INT, FLOAT, STR, BOOL = "int", "float", "str", "bool"


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    type: str  # INT, FLOAT, STR or BOOL
    doc: str = ""
    nullable: bool = False
    # A column added to a table after rows were built positionally elsewhere: their value
    # when left out (the trailing columns with one may be omitted from a row_type() row).
    default: Any = None


@dataclasses.dataclass(frozen=True)
class TableSpec:
    name: str
    doc: str
    columns: tuple[Column, ...]
    live: bool = False  # computed when queried (stacks, tensors), never stored
    write_through: bool = False  # each row on disk as it happens (store/journal.py)
    capacity: int = 1_000_000  # rows kept in memory; the oldest go first
    # Write-through rows of one `group` (with no `peer`) end in `seq` order: a backend runs a
    # group's collectives in the order they were issued, so one seen completed ends the open
    # ones before it (gloo's reduce_scatter_tensor work never says it completed).
    ends_in_order: bool = False

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def index(self, name: str) -> int:
        return self.column_names.index(name)

    def row_type(self) -> Any:
        """A named tuple of this table's columns: rows built by column name, stored as tuples."""
        defaults: list[Any] = []
        for column in reversed(self.columns):
            if column.default is None:
                break
            defaults.insert(0, column.default)
        return collections.namedtuple(f"{self.name}_row", self.column_names, defaults=defaults)


def _c(name: str, type_: str, doc: str = "", nullable: bool = False, default: Any = None) -> Column:
    return Column(name, type_, doc, nullable, default)


BACKTRACE = TableSpec(
    "backtrace",
    "a frame of a live thread (torchdoctor's own threads left out)",
    (
        _c("thread_id", INT, "Python thread identifier"),
        _c("thread_name", STR),
        _c("depth", INT, "0 = innermost frame"),
        _c("func", STR, "function name"),
        _c("file", STR),
        _c("lineno", INT),
        _c("code", STR, "the source line, stripped", nullable=True),
        _c("is_main", BOOL, "frame of the main thread"),
    ),
    live=True,
)

THREADS = TableSpec(
    "threads",
    "a live thread",
    (
        _c("thread_id", INT),
        _c("name", STR),
        _c("daemon", BOOL),
        _c("alive", BOOL),
        _c("is_main", BOOL),
        _c("probe", BOOL, "a thread of torchdoctor itself"),
    ),
    live=True,
)

STEPS = TableSpec(
    "steps",
    "a training step (an optimizer step; micro-batches of gradient accumulation inside it)",
    (
        _c("step", INT, "optimizer steps counted from 0"),
        _c("time", FLOAT, "wall-clock time at the end of the step (Unix seconds)"),
        _c("duration", FLOAT, "from the end of the previous step to the end of this one"),
        _c(
            "data_wait",
            FLOAT,
            "time inside DataLoader iterators, and in the loop's own input function once stack "
            "samples found one (get_batch, a generator)",
        ),
        _c("forward", FLOAT, "time inside the models' top-level calls"),
        _c("backward", FLOAT, "time inside backward()"),
        _c("optimizer", FLOAT, "time inside optimizer.step()"),
        _c(
            "other",
            FLOAT,
            "the rest of the step: a loss computed after the model returns, zero_grad, "
            "logging, your own code",
        ),
        _c("loss", FLOAT, "value of the tensor backward() was called on (unscaled)", True),
        _c("grad_norm", FLOAT, "total L2 norm of the gradients before the update", True),
        _c("lr", FLOAT, "learning rate of the first parameter group", True),
        _c("allocated", INT, "CUDA: allocator's allocated bytes; CPU: resident set size"),
        _c("max_allocated", INT, "CUDA: allocator peak; CPU: peak resident set size"),
        _c("reserved", INT, "CUDA: reserved by the caching allocator; CPU: same as rss"),
        _c("rss", INT, "resident set size of the process"),
        _c("rank", INT),
        _c("micro_batches", INT, "backward() calls in the step"),
        _c("skipped", BOOL, "the update was skipped (--guard, non-finite gradients)"),
        _c("traced", BOOL, "module calls of this step are in torch_trace"),
        _c(
            "evaluation",
            FLOAT,
            "time in model calls with gradients off (an evaluation pass, torch.no_grad()) since "
            "the previous step: not in forward",
            default=0.0,
        ),
    ),
)
# The columns of python.steps that split its duration, in the order they are shown.
STEP_PHASES = ("data_wait", "forward", "evaluation", "backward", "optimizer", "other")

OPTIMIZER_STEPS = TableSpec(
    "optimizer_steps",
    "one optimizer.step() of a run with several optimizers (a GAN's generator and "
    "discriminator each have rows; a run of one optimizer has its updates in python.steps)",
    (
        _c("step", INT, "the python.steps step it belongs to"),
        _c("optimizer", STR, "the script's name for it (opt_g), else class and number"),
        _c("is_primary", BOOL, "the optimizer whose steps are the rows of python.steps"),
        _c("loss", FLOAT, "mean loss of the backward() calls since the last optimizer step", True),
        _c("grad_norm", FLOAT, "total L2 norm of its gradients before the update", True),
        _c("lr", FLOAT, "learning rate of its first parameter group", True),
        _c("duration", FLOAT, "time inside step()"),
        _c("skipped", BOOL, "the update was skipped (--guard, GradScaler)"),
        _c("time", FLOAT),
        _c("rank", INT),
    ),
)

COLLECTIVES = TableSpec(
    "collectives",
    "a collective or point-to-point call of torch.distributed (DDP's and FSDP's own included)",
    (
        _c("step", INT, "the step in progress when it was issued"),
        _c("group", STR, "process group: 'default' or its name / ranks"),
        _c("seq", INT, "sequence number within the group on this rank, from 0"),
        _c("op", STR, "all_reduce, broadcast, all_gather, reduce_scatter, barrier, send, ..."),
        _c("shapes", STR, "JSON list of the tensors' shapes", nullable=True),
        _c("dtype", STR, nullable=True),
        _c("bytes", INT, "bytes of the tensors this rank contributes"),
        _c("peer", INT, "send/recv: the other rank", nullable=True),
        _c("time", FLOAT, "wall-clock time when it was issued"),
        _c("duration", FLOAT, "issue to completion, where known", nullable=True),
        _c("state", STR, "issued, completed or failed"),
        _c("site", STR, "file:line of the user's code that issued it", nullable=True),
        _c("rank", INT),
    ),
    write_through=True,
    ends_in_order=True,
)

TORCH_TRACE = TableSpec(
    "torch_trace",
    "one module call in a traced step",
    (
        _c("step", INT),
        _c("module", STR, "qualified name, e.g. encoder.layers.3.attn"),
        _c("type", STR, "module class"),
        _c("stage", STR, "forward or backward"),
        _c("duration", FLOAT),
        _c("allocated", INT, "memory after the call (see steps.allocated)"),
        _c("max_allocated", INT, "peak so far (see steps.max_allocated)"),
        _c("time", FLOAT, "wall-clock time at the start of the call"),
        _c("depth", INT, "nesting depth, 0 = a model"),
        _c("rank", INT),
    ),
)

SHAPES = TableSpec(
    "shapes",
    "one module call of a traced step (and of the first step), with what flowed in and out",
    (
        _c("step", INT),
        _c("call", INT, "order of the call in its step, from 0 (a parent before its children)"),
        _c("module", STR, "qualified name, e.g. encoder.layers.3.attn"),
        _c("type", STR, "module class"),
        _c("depth", INT, "nesting depth, 0 = a model"),
        _c("input_shapes", STR, "shapes of the tensor arguments, e.g. [8, 3, 32, 32], [8]", True),
        _c("input_dtypes", STR, "their dtypes, in the same order", nullable=True),
        _c("input_devices", STR, "their devices, in the same order", nullable=True),
        _c("output_shapes", STR, "shapes of the tensors returned", nullable=True),
        _c("output_dtypes", STR, nullable=True),
        _c("output_devices", STR, nullable=True),
        _c("raised", BOOL, "the call raised an exception (no output)"),
        _c("rank", INT),
    ),
)

MODULES = TableSpec(
    "modules",
    "a module of a watched model",
    (
        _c("model", STR, "name of the model it belongs to"),
        _c("name", STR, "qualified name ('' for the model itself)"),
        _c("type", STR),
        _c("params", INT, "parameters owned directly by this module"),
        _c("trainable", INT, "of those, the ones with requires_grad"),
        _c("device", STR, nullable=True),
        _c("dtype", STR, nullable=True),
        _c("depth", INT),
    ),
    capacity=200_000,
)

MODULE_GRADS = TableSpec(
    "module_grads",
    "gradient and weight norms of one module's own parameters, on traced steps",
    (
        _c("step", INT),
        _c(
            "module",
            STR,
            "qualified name (parameters of no module seen called: "
            "`parameters of OPTIMIZER (no module call seen)`)",
        ),
        _c("grad_norm", FLOAT, "L2 norm of the gradients (NULL: no parameter got one)", True),
        _c("param_norm", FLOAT, "L2 norm of the weights"),
        _c("with_grad", INT, "parameters that received a gradient"),
        _c("trainable", INT, "parameters with requires_grad"),
        _c("rank", INT),
    ),
)

MEMORY = TableSpec(
    "memory",
    "memory at a phase boundary of a traced step (setup, forward, backward, optimizer)",
    (
        _c("step", INT),
        _c("phase", STR, "setup, forward, backward or optimizer: memory at its end"),
        _c("allocated", INT),
        _c("max_allocated", INT),
        _c("reserved", INT),
        _c("time", FLOAT),
        _c("rank", INT),
    ),
)

TENSORS = TableSpec(
    "tensors",
    "a live tensor (shared storage counted once)",
    (
        _c("kind", STR, "parameter, gradient, optimizer_state, buffer, activation or other"),
        _c("name", STR, "e.g. encoder.0.weight, exp_avg of encoder.0.weight", nullable=True),
        _c("shape", STR),
        _c("dtype", STR),
        _c("device", STR),
        _c("bytes", INT, "bytes of storage owned (0 when another row owns the storage)"),
        _c("requires_grad", BOOL),
        _c("grad_fn", STR, nullable=True),
        _c(
            "total_bytes",
            INT,
            "a sharded tensor (DTensor) whole, over all ranks; an FSDP2 unit's parameter held "
            "whole: its bytes (NULL: not sharded)",
            nullable=True,
        ),
        _c("world", INT, "ranks a DTensor's device mesh spans (NULL: not sharded)", True),
        _c("placements", STR, "a DTensor's placements: Shard(dim=0), Replicate()", True),
        _c("unit", STR, "the FSDP2 unit (fully_shard module) that all-gathers it", True),
    ),
    live=True,
)

DIAGNOSES = TableSpec(
    "diagnoses",
    "a problem found",
    (
        _c("time", FLOAT),
        _c("step", INT, nullable=True),
        _c("rank", INT),
        _c("kind", STR, "stable code: nan, divergence, hang, ..."),
        _c("severity", STR, "info, warning or error"),
        _c("location", STR, "module qualified name or file:line", nullable=True),
        _c("summary", STR),
        _c("evidence", STR, "JSON object of the measured numbers"),
        _c(
            "fix",
            STR,
            "ranked remedies, one per line; the further lines of a fix's code are indented by "
            "four spaces",
        ),
        _c(
            "resolved",
            INT,
            "the step from which it no longer held (null: it holds); the latest row of a "
            "finding is its state",
            nullable=True,
        ),
        _c(
            "follows",
            STR,
            "the kind of the earlier finding it follows from (exploding_gradients -> "
            "divergence -> nan: one cause, one chain)",
            nullable=True,
        ),
    ),
    capacity=100_000,
)

FIX_CONTINUED = "    "  # a fix's further lines in the `fix` column (its code block)


def join_fixes(fixes: Sequence[str]) -> str:
    """The `fix` column of ranked remedies: one per line, the further lines of a fix (a code
    block) indented, so that a reader gets every fix back whole (split_fixes)."""
    lines = []
    for fix in fixes:
        head, *rest = fix.splitlines() or [""]
        lines.append(head)
        lines.extend(FIX_CONTINUED + line for line in rest)
    return "\n".join(lines)


def split_fixes(text: str | None) -> list[str]:
    """The remedies of a `fix` column, each whole (see join_fixes)."""
    fixes: list[str] = []
    for line in (text or "").split("\n"):
        if line.startswith(FIX_CONTINUED) and fixes:
            fixes[-1] += "\n" + line[len(FIX_CONTINUED) :]
        elif line.strip():
            fixes.append(line)
    return fixes


EVENTS = TableSpec(
    "events",
    "something torchdoctor noticed: a model or loader seen, a hook disabled, a replay done",
    (
        _c("time", FLOAT),
        _c("step", INT, nullable=True),
        _c("kind", STR),
        _c("data", STR, "JSON object"),
    ),
    capacity=100_000,
)

COMPILE = TableSpec(
    "compile",
    "a torch.compile event: a function compiled or recompiled, a graph break, the recompile limit",
    (
        _c("time", FLOAT),
        _c("step", INT, "the step in progress (NULL before the first)", nullable=True),
        _c("rank", INT),
        _c("kind", STR, "compile, recompile, graph_break or recompile_limit"),
        _c("function", STR, "the compiled function's name", nullable=True),
        _c("code", STR, "file:line where the compiled function starts", nullable=True),
        _c("location", STR, "user file:line: of the graph break; of the call that compiled", True),
        _c("reason", STR, "graph break: why; recompile: the guard that failed", nullable=True),
        _c("detail", STR, "dynamo's explanation and hints (graph breaks)", nullable=True),
        _c("compile_id", STR, "dynamo's frame/compile id, e.g. 0/3", nullable=True),
        _c("count", INT, "occurrences so far of this kind, function, location and reason"),
        _c("duration", FLOAT, "compile time in seconds (compile, recompile)", nullable=True),
    ),
    capacity=100_000,
)

ALL_TABLES: tuple[TableSpec, ...] = (
    BACKTRACE,
    THREADS,
    STEPS,
    OPTIMIZER_STEPS,
    COLLECTIVES,
    TORCH_TRACE,
    SHAPES,
    MODULES,
    MODULE_GRADS,
    MEMORY,
    TENSORS,
    DIAGNOSES,
    EVENTS,
    COMPILE,
)
BY_NAME: dict[str, TableSpec] = {t.name: t for t in ALL_TABLES}
STORED: tuple[TableSpec, ...] = tuple(t for t in ALL_TABLES if not t.live)


def describe_tables(names: list[str]) -> list[dict[str, Any]]:
    return describe_specs([BY_NAME[name] for name in names])


def describe_specs(specs: list[TableSpec]) -> list[dict[str, Any]]:
    out = []
    for spec in specs:
        out.append(
            {
                "schema": "python",
                "name": spec.name,
                "doc": spec.doc,
                "live": spec.live,
                "columns": [
                    {"name": c.name, "type": c.type, "nullable": c.nullable, "doc": c.doc}
                    for c in spec.columns
                ],
            }
        )
    return out
