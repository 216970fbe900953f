"""Parsing for lint: a fixed modern grammar (valid Python 3.12-3.14 syntax is never a
syntax error, whatever Python runs the linter), real syntax errors still are, and files
are decoded by their PEP 263 declarations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor.lint.engine import SYNTAX_ERROR, lint_paths, lint_source
from torchdoctor.lint.parse import SyntaxProblem, decode, parse
from torchdoctor.lint.rules import all_rules

UNSAFE = "state = torch.load('ckpt.pt', weights_only=False)\n"

MODERN = {
    "pep695_alias": "type Batch[T] = list[T]\n",
    "pep695_function": "def first[T](xs: list[T]) -> T:\n    return xs[0]\n",
    "pep695_class": "class Box[T: (int, float)](object):\n    pass\n",
    "pep696_default": "def pad[T = int](x: T) -> T:\n    return x\n",
    "pep701_quotes": 'cfg = {"lr": 1}\nmsg = f"lr={cfg["lr"]}"\n',
    "pep701_nested": 'msg = f"{f"{f"{1}"}"}"\n',
    "pep701_multiline": 'names = ["a"]\nmsg = f"""{"\\n".join(names)}\n"""\n',
    "except_star": "try:\n    pass\nexcept* ValueError as group:\n    pass\n",
}


@pytest.mark.parametrize("name", sorted(MODERN))
def test_modern_syntax_is_linted_not_a_syntax_error(name: str) -> None:
    # The rules still run on such a file, at the right lines.
    source = "import torch\n" + MODERN[name] + UNSAFE
    findings = lint_source(source, all_rules(), "modern.py")
    line = source.count("\n")
    assert [(f.line, f.code) for f in findings] == [(line, "TD701")], findings


def test_modern_syntax_is_lowered_on_the_same_lines() -> None:
    source = 'type X = int\ndef f[T](x: T) -> T:\n    return f"{x["k"]}"\ny = 1\n'
    tree = parse(source)
    assert not isinstance(tree, SyntaxProblem)
    assert [n.lineno for n in tree.body] == [1, 2, 4]


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("def f(:\n    pass\n", 1),
        ("x = (1,\n", 1),
        ("print 'hello'\n", 1),
        ("type X = int\nok = 1\nbroken = (1,\n", 3),
        ("x = 1\ntargets.cuda(async=True)\n", 2),
        ("print('epoch %d'\n#   % (1,))\n\n\nz = 1\nw = 2\n", 1),  # reported where it opens
    ],
)
def test_real_syntax_errors_stay_td000(source: str, line: int) -> None:
    findings = lint_source(source, all_rules(), "bad.py")
    assert [(f.code, f.line) for f in findings] == [(SYNTAX_ERROR, line)]
    assert findings[0].message.startswith("cannot parse")


def test_pep263_declarations(tmp_path: Path) -> None:
    latin = "# -*- coding: latin-1 -*-\n# caf\u00e9\nimport torch\n" + UNSAFE
    (tmp_path / "latin.py").write_bytes(latin.encode("latin-1"))
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbfimport torch\n" + UNSAFE.encode())
    (tmp_path / "undeclared.py").write_bytes(b"x = '\xe9'\n")
    (tmp_path / "unknown.py").write_bytes(b"# coding: klingon\nx = 1\n")
    found = {
        (Path(f.path).name, f.code, f.line)
        for f in lint_paths([str(tmp_path)], all_rules()).findings
    }
    assert found == {
        ("latin.py", "TD701", 4),
        ("bom.py", "TD701", 2),
        ("undeclared.py", SYNTAX_ERROR, 1),
        ("unknown.py", SYNTAX_ERROR, 1),
    }
    assert decode(b"\xef\xbb\xbfx = 1\n") == "x = 1\n"
    assert isinstance(decode(b"# coding: klingon\n"), SyntaxProblem)


def test_lint_and_its_engine_import_neither_torch_nor_libcst_nor_the_catalog() -> None:
    # The engine takes the rules it is given: importing it loads no rule module, and
    # LibCST is loaded only for files the interpreter cannot parse.
    code = (
        "import sys\n"
        "from torchdoctor.lint.engine import lint_source\n"
        "assert 'torchdoctor.lint.rules' not in sys.modules\n"
        "from torchdoctor.lint.rules import all_rules\n"
        "lint_source('import torch\\nx = 1\\n', all_rules())\n"
        "assert 'libcst' not in sys.modules and 'torch' not in sys.modules\n"
        "lint_source('type X = int\\n', all_rules())\n"
        "assert 'torch' not in sys.modules\n"
        # Python 3.12 parses PEP 695 itself: no need for LibCST there.
        "assert ('libcst' in sys.modules) == (sys.version_info < (3, 12))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
