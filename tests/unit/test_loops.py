"""cluster/loops.py reads loop ranges with the tokenizer (the doctor's thread must not build
ASTs: CPython 3.11's AST construction is not safe from two threads at once). Its ranges are
the ast module's, on every source of torch and of this project."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from helpers import ROOT

from torchdoctor.cluster.loops import loop_ranges, loops_in


def _ast_loops(source: str) -> list[tuple[int, int]]:
    tree = ast.parse(source)
    loops = (ast.For, ast.AsyncFor, ast.While)
    return sorted(
        (n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree) if isinstance(n, loops)
    )


def test_the_ranges_are_the_ast_modules() -> None:
    torch_dir = Path(torch.__file__).parent
    files = [*(torch_dir / "nn").rglob("*.py"), *(torch_dir / "optim").rglob("*.py")]
    files += [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests" / "scripts").glob("*.py")]
    compared = 0
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            expected = _ast_loops(source)
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        assert loops_in(source) == expected, path
        compared += 1
    assert compared > 300


def test_shapes_of_loops() -> None:
    source = (
        "for a in x:\n"  # 1
        "    for b in y: pass\n"  # 2: one line
        "    while c:\n"  # 3
        "        c -= 1\n"  # 4
        "    else:\n"  # 5: the while's else
        "        d = [i for i in z]\n"  # 6: a comprehension is no loop
        "async def f():\n"  # 7
        "    async for e in g:\n"  # 8
        "        # a comment\n"  # 9
        "        pass\n"  # 10
        "\n"
        "h = 1\n"
    )
    assert loops_in(source) == [(1, 6), (2, 2), (3, 6), (8, 10)]
    assert loops_in(source) == _ast_loops(source)


def test_a_file_that_cannot_be_read(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("for x in (:\n")
    assert loop_ranges(str(broken)) is None
    assert loop_ranges(str(tmp_path / "missing.py")) is None
