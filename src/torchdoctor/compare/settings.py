"""How two runs were run, side by side: the settings that change speed, memory or numbers (compile,
dtype and autocast, the DataLoader's workers, the batch size, torch and CUDA, the environment
variables that matter, the script and its arguments), each read from what the run recorded:
meta.json (run_setup.py wrote it at start), the `dataloader` and `compile_seen` events,
python.compile, python.modules and the first step's python.shapes.

Each setting is a `Setting` with both values as text; `differs` says whether they do, and
`weight` orders the differences as likely causes in the headline (a compiled model against an
eager one explains more than a changed environment variable).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections import Counter
from typing import Any

from torchdoctor.compare import contention
from torchdoctor.compare.facts import RunFacts

MAX_DIFF_LINES = 200
SIXTEEN_BIT = ("float16", "bfloat16")
# Options whose value says where the record goes or how to reach it, not how the run runs.
_PLACES = ("--run-dir", "--listen", "--token", "--metrics")
BUSY = 0.75  # load per CPU from which a machine's load slows a run down
BUSIER = 1.5
UNKNOWN = "not recorded"


@dataclasses.dataclass
class Setting:
    key: str
    label: str
    a: str
    b: str
    weight: int  # higher: more likely to explain a difference in speed, memory or numbers
    phrase: str = ""  # the headline's words for the difference ("B runs with compile off")
    judged: bool | None = None  # whether they differ, where that is more than a != b

    @property
    def differs(self) -> bool:
        if self.judged is not None:
            return self.judged
        return self.a != self.b and UNKNOWN not in (self.a, self.b)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "a": self.a,
            "b": self.b,
            "differs": self.differs,
            "phrase": self.phrase if self.differs else "",
        }


def settings(a: RunFacts, b: RunFacts) -> list[Setting]:
    out: list[Setting] = []

    def add(key: str, label: str, weight: int, fa: Any, fb: Any, phrase: str) -> None:
        va, vb = _text(fa), _text(fb)
        out.append(Setting(key, label, va, vb, weight, phrase.format(a=va, b=vb)))

    add(
        "compile", "torch.compile", 90, compiled(a), compiled(b), "B runs with compile {b} (A: {a})"
    )
    pa, pb = param_dtype(a), param_dtype(b)
    add("dtype", "parameter dtype", 85, pa, pb, "B's parameters are {b} (A: {a})")
    ca, cb = compute_dtype(a), compute_dtype(b)
    add("compute_dtype", "compute dtype", 84, ca, cb, "B computes in {b} (A: {a})")
    add("autocast", "autocast", 83, autocast(a), autocast(b), "B runs autocast {b} (A: {a})")
    la, lb = loader(a), loader(b)
    for facts_, seen in ((la, a.loaders), (lb, b.loaders)):
        if seen:  # a loader was seen: an option it does not have (no workers, no prefetch)
            for key, value in list(facts_.items()):
                facts_[key] = "-" if value is None else value
    add(
        "num_workers",
        "DataLoader workers",
        80,
        la.get("num_workers"),
        lb.get("num_workers"),
        "B's DataLoader has {b} workers (A: {a})",
    )
    add(
        "batch_size",
        "batch size",
        75,
        batch_size(a),
        batch_size(b),
        "B's batch size is {b} (A: {a})",
    )
    for key in ("pin_memory", "persistent_workers", "prefetch_factor"):
        add(
            key,
            f"DataLoader {key}",
            60,
            la.get(key),
            lb.get(key),
            f"B's DataLoader has {key}={{b}} (A: {{a}})",
        )
    add("device", "device", 70, device(a), device(b), "B runs on {b} (A: {a})")
    add("world_size", "ranks", 70, world_size(a), world_size(b), "B runs {b} ranks (A: {a})")
    ta, tb = a.meta.get("torch") or {}, b.meta.get("torch") or {}
    add("torch", "torch", 65, ta.get("version"), tb.get("version"), "B runs torch {b} (A: {a})")
    add(
        "cuda",
        "torch build",
        65,
        ta.get("build"),
        tb.get("build"),
        "B's torch is built for {b} (A: {a})",
    )
    add("script", "script", 55, script_id(a), script_id(b), "B's script differs{{diff}}")
    add(
        "arguments",
        "script arguments",
        50,
        arguments(a),
        arguments(b),
        "B's arguments are `{b}` (A: `{a}`)",
    )
    add("command", "command line", 15, command(a), command(b), "B's command line differs")
    out.append(waiting(a, b))
    out.append(machine_load(a, b))
    add(
        "trace_every",
        "--trace-every",
        20,
        a.meta.get("trace_every"),
        b.meta.get("trace_every"),
        "B traces modules every {b} steps (A: {a})",
    )
    add(
        "python",
        "Python",
        40,
        a.meta.get("python"),
        b.meta.get("python"),
        "B runs Python {b} (A: {a})",
    )
    add("host", "host", 30, a.meta.get("host"), b.meta.get("host"), "B ran on {b} (A: {a})")
    add(
        "cpus",
        "CPUs",
        30,
        a.meta.get("cpus"),
        b.meta.get("cpus"),
        "B's machine has {b} CPUs (A: {a})",
    )
    env_a, env_b = a.meta.get("environment"), b.meta.get("environment")
    if isinstance(env_a, dict) and isinstance(env_b, dict):
        for name in sorted(set(env_a) | set(env_b)):
            va, vb = env_a.get(name, "(unset)"), env_b.get(name, "(unset)")
            add(f"env:{name}", name, 45, va, vb, f"B sets {name}={{b}} (A: {{a}})")
    else:
        add("environment", "environment", 45, _env_text(env_a), _env_text(env_b), "")
    diff = script_diff(a, b)
    for s in out:
        if s.key == "script":
            s.phrase = s.phrase.replace("{diff}", f" ({_diff_size(diff)})" if diff else "")
    return out


def _text(value: Any) -> str:
    if value is None:
        return UNKNOWN
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _env_text(env: Any) -> str | None:
    return None if not isinstance(env, dict) else "recorded"


def compiled(f: RunFacts) -> bool:
    return f.compile_seen or f.compile.get("compile", 0) > 0


def _params(f: RunFacts) -> list[dict[str, Any]]:
    return [p for p in f.params if (p.get("params") or 0) > 0]


def param_dtype(f: RunFacts) -> str | None:
    """The dtype that holds most of the parameters."""
    count: Counter[str] = Counter()
    for p in _params(f):
        if p.get("dtype"):
            count[str(p["dtype"])] += int(p["params"])
    return count.most_common(1)[0][0] if count else None


def compute_dtype(f: RunFacts) -> str | None:
    """The dtype the modules with parameters return on the first step recorded (under autocast,
    16 bits while the parameters stay 32)."""
    owners = {str(p["name"]) for p in _params(f)}
    count: Counter[str] = Counter()
    for call in f.first_calls:
        if str(call.get("module")) in owners and call.get("output_dtypes"):
            count[str(call["output_dtypes"]).split(",")[0].strip()] += 1
    return count.most_common(1)[0][0] if count else None


def autocast(f: RunFacts) -> str | None:
    params, compute = param_dtype(f), compute_dtype(f)
    if params is None or compute is None:
        return None
    if compute in SIXTEEN_BIT and params not in SIXTEEN_BIT:
        return compute
    return "off"


def loader(f: RunFacts) -> dict[str, Any]:
    """The first DataLoader the training iterated (the training one, usually)."""
    return dict(f.loaders[0]) if f.loaders else {}


def batch_size(f: RunFacts) -> int | None:
    """The first dimension of the model's first input; else the DataLoader's batch_size."""
    for call in f.first_calls:
        if int(call.get("depth") or 0) == 0 and call.get("input_shapes"):
            first = str(call["input_shapes"]).split("]")[0].strip("[ ")
            dim = first.split(",")[0].strip()
            if dim.isdigit():
                return int(dim)
    value = loader(f).get("batch_size")
    return int(value) if isinstance(value, int) else None


def device(f: RunFacts) -> str | None:
    count: Counter[str] = Counter()
    for p in _params(f):
        if p.get("device"):
            count[str(p["device"])] += int(p["params"])
    return count.most_common(1)[0][0] if count else None


def world_size(f: RunFacts) -> int | None:
    size = f.meta.get("world_size")
    return int(size) if isinstance(size, int) else (len(f.ranks) or None)


def script_id(f: RunFacts) -> str | None:
    script = f.meta.get("script")
    if not isinstance(script, dict):
        return None
    name = str(script.get("path") or "").rsplit("/", 1)[-1]
    return f"{name} (sha256 {str(script.get('sha256'))[:12]})"


def arguments(f: RunFacts) -> str | None:
    script = f.meta.get("script")
    if not isinstance(script, dict) or not isinstance(script.get("argv"), list):
        return None
    return " ".join(str(x) for x in script["argv"][1:])


def command(f: RunFacts) -> str | None:
    """The command line, without the options that only say where the record goes."""
    argv = f.meta.get("command")
    if not isinstance(argv, list):
        return None
    out: list[str] = []
    skip = False
    for arg in map(str, argv):
        if skip:
            skip = False
        elif arg in _PLACES:
            skip = True
        elif not arg.startswith(tuple(f"{p}=" for p in _PLACES)):
            out.append(arg)
    return " ".join(out)


def machine_load(a: RunFacts, b: RunFacts) -> Setting:
    """How busy each run's machine was (1-minute load average per CPU, at the run's start and
    end). They differ when one is BUSIER times the other and above BUSY per CPU."""
    la, lb = contention.load_per_cpu(a.meta), contention.load_per_cpu(b.meta)
    va = UNKNOWN if la is None else f"{la:.2f} per CPU"
    vb = UNKNOWN if lb is None else f"{lb:.2f} per CPU"
    judged, phrase = False, ""
    if la is not None and lb is not None:
        high, low = max(la, lb), min(la, lb)
        judged = high >= BUSY and high >= BUSIER * max(low, 1e-3)
        which = "A" if la > lb else "B"
        phrase = f"the machine was busier during {which} (load {high:.1f} per CPU, {low:.1f})"
    return Setting("load", "machine load", va, vb, 30, phrase, judged)


def waiting(a: RunFacts, b: RunFacts) -> Setting:
    """The share of each run's time its main thread waited for a CPU (contention.py)."""
    wa, wb = contention.waiting_share(a.meta), contention.waiting_share(b.meta)
    va = UNKNOWN if wa is None else f"{wa:.0%}"
    vb = UNKNOWN if wb is None else f"{wb:.0%}"
    judged = wa is not None and wb is not None and abs(wb - wa) >= contention.MIN_APART
    phrase = f"B waited for a CPU {vb} of its time (A: {va})"
    return Setting("waiting", "time waiting for a CPU", va, vb, 89, phrase, judged)


def script_diff(a: RunFacts, b: RunFacts) -> str | None:
    """A unified diff of the two scripts' saved copies, when their hashes differ."""
    sa, sb = a.meta.get("script"), b.meta.get("script")
    if not isinstance(sa, dict) or not isinstance(sb, dict) or sa.get("sha256") == sb.get("sha256"):
        return None
    if a.script_text is None or b.script_text is None:
        return None
    lines = list(
        difflib.unified_diff(
            a.script_text.splitlines(),
            b.script_text.splitlines(),
            fromfile=f"A: {sa.get('path')}",
            tofile=f"B: {sb.get('path')}",
            lineterm="",
        )
    )
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[:MAX_DIFF_LINES], f"... {len(lines) - MAX_DIFF_LINES} more lines"]
    return "\n".join(lines)


def _diff_size(diff: str) -> str:
    lines = diff.splitlines()
    plus = sum(1 for x in lines if x.startswith("+") and not x.startswith("+++"))
    minus = sum(1 for x in lines if x.startswith("-") and not x.startswith("---"))
    return f"+{plus} -{minus} lines"
