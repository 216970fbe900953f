"""Source files to syntax trees, whatever Python runs the linter.

Files are decoded as Python itself does (PEP 263 coding declarations, a UTF-8 BOM, UTF-8
otherwise). The tree is the running interpreter's `ast`, which the rules are written for.
The interpreter's grammar is not the judge of validity, though: a file that `ast` rejects is
parsed again with LibCST's grammar, which accepts every Python syntax up to 3.14 on any
interpreter. When LibCST accepts it (PEP 695 `type X = ...` and `def f[T]`, PEP 701 nested
f-strings, `except*` on 3.10, on an older interpreter), the newer constructs are lowered to
equivalents the interpreter knows, on the same lines, and the rules run as usual. Only a
file that both grammars reject is a syntax error.
"""

from __future__ import annotations

import ast
import codecs
import functools
import io
import re
import tokenize
import warnings
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SyntaxProblem:
    """Why a file has no tree: a syntax error (or an undecodable file) at a position."""

    line: int
    col: int
    message: str


class LoweringFailed(Exception):
    """Valid Python by the modern grammar that could not be turned into this interpreter's
    `ast` (a construct the lowering does not know yet): not a syntax error of the file."""


def decode(raw: bytes) -> str | SyntaxProblem:
    """The text of a source file, decoded by its PEP 263 declaration (UTF-8 by default)."""
    try:
        encoding, _lines = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as exc:  # not UTF-8 without a declaration, an unknown encoding
        if "invalid or missing" in exc.msg:
            return SyntaxProblem(1, 1, "cannot read: not UTF-8 and no coding declaration")
        return SyntaxProblem(1, 1, f"cannot read: {exc.msg}")
    try:
        codecs.lookup(encoding)
        return raw.decode(encoding).removeprefix("\ufeff")
    except (LookupError, UnicodeDecodeError):
        what = "not UTF-8" if encoding.startswith("utf") else f"not valid {encoding}"
        return SyntaxProblem(1, 1, f"cannot read: {what}")


def parse(source: str, path: str = "<string>") -> ast.Module | SyntaxProblem:
    """The file's tree, or the syntax error that both grammars agree on. Raises
    LoweringFailed for valid modern syntax that cannot be lowered."""
    try:
        return _ast(source, path)
    except SyntaxError as exc:
        native = SyntaxProblem(exc.lineno or 1, exc.offset or 1, f"cannot parse: {exc.msg}")
    except ValueError as exc:  # null bytes
        return SyntaxProblem(1, 1, f"cannot parse: {exc}")
    # Heavy, and only needed for files the interpreter cannot parse: imported here.
    import libcst

    try:
        module = libcst.parse_module(source)
    except libcst.ParserSyntaxError as exc:
        # The interpreter's message and position are the better ones, unless it stopped
        # at newer syntax before the real error.
        lines = source.splitlines()
        stopped_at = lines[native.line - 1] if 0 < native.line <= len(lines) else ""
        if native.line >= exc.raw_line - 1 or not _MODERN.search(stopped_at):
            return native
        return SyntaxProblem(exc.raw_line, exc.raw_column + 1, "cannot parse: invalid syntax")
    except Exception as exc:  # LibCST failed (deep recursion): validity unknown, our limit
        raise LoweringFailed(f"{type(exc).__name__}: {exc}") from None
    try:
        return _ast(module.visit(_lowering()()).code, path)
    except (SyntaxError, ValueError) as exc:
        raise LoweringFailed(f"{type(exc).__name__}: {exc}") from None


# Lines that an older interpreter rejects for their syntax alone.
_MODERN = re.compile(
    r"^\s*type\s+\w+|^\s*(?:async\s+)?def\s+\w+\s*\[|^\s*class\s+\w+\s*\[|except\s*\*"
    r"|\b[fFtT][rR]?['\"]|\b[rR][fFtT]['\"]"
)


def _ast(source: str, path: str) -> ast.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarning for odd escapes is not ours
        return ast.parse(source, filename=path)


def _parses_as_expression(code: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(f"({code})", mode="eval")
        return True
    except (SyntaxError, ValueError):
        return False


def _blank_string(libcst: Any, code: str) -> Any:
    """A plain string literal spanning as many lines as `code`."""
    newlines = code.count("\n")
    return libcst.SimpleString('"""' + "\n" * newlines + '"""' if newlines else '""')


def _make_lowering() -> type:
    import libcst

    class Lower(libcst.CSTTransformer):
        """Newer syntax as older syntax on the same lines: type parameters dropped,
        `type X = v` as `X = v`, f-strings the interpreter cannot read as plain strings,
        `except*` as `except`."""

        def leave_FunctionDef(self, original: Any, updated: Any) -> Any:
            if updated.type_parameters is None:
                return updated
            return updated.with_changes(
                type_parameters=None,
                whitespace_after_type_parameters=libcst.SimpleWhitespace(""),
            )

        def leave_ClassDef(self, original: Any, updated: Any) -> Any:
            if updated.type_parameters is None:
                return updated
            return updated.with_changes(
                type_parameters=None,
                whitespace_after_type_parameters=libcst.SimpleWhitespace(""),
            )

        def leave_TypeAlias(self, original: Any, updated: Any) -> Any:
            return libcst.Assign(
                targets=[libcst.AssignTarget(target=updated.name)], value=updated.value
            )

        def leave_FormattedString(self, original: Any, updated: Any) -> Any:
            code = libcst.Module(body=[]).code_for_node(updated)
            return updated if _parses_as_expression(code) else _blank_string(libcst, code)

        def leave_TemplatedString(self, original: Any, updated: Any) -> Any:
            return _blank_string(libcst, libcst.Module(body=[]).code_for_node(updated))

        def leave_TryStar(self, original: Any, updated: Any) -> Any:
            handlers = [
                libcst.ExceptHandler(
                    body=h.body,
                    type=h.type,
                    name=h.name,
                    leading_lines=h.leading_lines,
                    whitespace_after_except=libcst.SimpleWhitespace(" "),
                    whitespace_before_colon=h.whitespace_before_colon,
                )
                for h in updated.handlers
            ]
            return libcst.Try(
                body=updated.body,
                handlers=handlers,
                orelse=updated.orelse,
                finalbody=updated.finalbody,
                leading_lines=updated.leading_lines,
                whitespace_before_colon=updated.whitespace_before_colon,
            )

    return Lower


@functools.cache
def _lowering() -> type:
    """The LibCST transformer class, built on first use (LibCST is imported only then)."""
    return _make_lowering()
