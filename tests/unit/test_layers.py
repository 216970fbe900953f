"""The layering of the package, as a test: no module imports a component above its own, and no
import cycle, local imports (inside functions) and imports for type checking included.

The allowed directions are written once, as the table in docs/architecture.md between the
LAYERS markers: a component may import the components of lower layers, and its own modules.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import ROOT

PACKAGE = ROOT / "src" / "torchdoctor"
DOC = ROOT / "docs" / "architecture.md"


def layers() -> dict[str, int]:
    """component -> layer, from the table in docs/architecture.md."""
    text = DOC.read_text()
    start, end = text.index("<!-- LAYERS -->"), text.index("<!-- /LAYERS -->")
    out: dict[str, int] = {}
    for line in text[start:end].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        for name in re.findall(r"`([\w.]+)`", cells[1]):
            out[name] = int(cells[0])
    return out


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def component(module: str) -> str:
    """The top-level module or package under torchdoctor (`torchdoctor` for the public API)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "torchdoctor"


def resolve(name: str) -> str | None:
    """The torchdoctor module an import names (for `from pkg import mod`, the module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """Every torchdoctor module `module` imports, wherever the import statement is (inside a
    function or under TYPE_CHECKING too). `from pkg import name` depends on the module `name`
    when it is one, else on `pkg`."""
    tree = ast.parse(MODULES[module].read_text())
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package up node.level - 1 levels
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names += [f"{base}.{a.name}" for a in node.names]
    out = set()
    for name in names:
        if name == "torchdoctor" or name.startswith("torchdoctor."):
            target = resolve(name)
            if target is not None and target != module:
                out.add(target)
    return out


GRAPH = {m: imports(m) for m in MODULES}


def test_every_component_has_a_layer() -> None:
    known = layers()
    missing = sorted({component(m) for m in MODULES} - set(known))
    assert not missing, f"add these to the LAYERS table of docs/architecture.md: {missing}"


def test_no_import_goes_up_or_sideways() -> None:
    known = layers()
    bad = []
    for module, targets in sorted(GRAPH.items()):
        here = component(module)
        for target in sorted(targets):
            there = component(target)
            if there != here and known.get(there, 99) >= known.get(here, -1):
                bad.append(
                    f"{module} (layer {known.get(here)}) imports {target} "
                    f"(layer {known.get(there)})"
                )
    assert not bad, "\n".join(bad)


def test_no_import_cycle() -> None:
    # Tarjan's strongly connected components over the module graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    ("module", "target", "allowed"),
    [
        ("torchdoctor.memory.oom", "torchdoctor.diagnose.oom", False),
        ("torchdoctor.diagnose.nan", "torchdoctor.memory.estimate", True),
        ("torchdoctor.cli.main", "torchdoctor.session", True),
        ("torchdoctor.store.saved", "torchdoctor.probe.routes", False),
    ],
)
def test_the_rule_itself(module: str, target: str, allowed: bool) -> None:
    known = layers()
    here, there = component(module), component(target)
    assert (known[there] < known[here]) is allowed


def test_the_graph_sees_local_imports() -> None:
    # session.py imports the OOM capture inside report_crash: the edge must be in the graph
    assert "torchdoctor.memory.oom" in GRAPH["torchdoctor.session"]


def test_edges_are_recorded_both_ways() -> None:
    reverse: dict[str, set[str]] = defaultdict(set)
    for module, targets in GRAPH.items():
        for target in targets:
            reverse[target].add(module)
    assert "torchdoctor.session" in reverse["torchdoctor.store.rundir"]
