"""Finding the error that matters in text as users paste it.

Logs carry noise around the error: rank prefixes (``[rank3]:``, ``[default0]:``, ``3: ``),
timestamps, log levels, glog headers (``[E ProcessGroupNCCL.cpp:475]``), NCCL host prefixes,
warnings, progress bars. `clean` strips the prefixes and marks noise; `candidates` returns the
places an error may start, best first: exception lines (``SomeError: message``, the final
line of a traceback) from the last to the first, then every other line from the last to the
first. A candidate is a `TextBlock`: its line plus the lines that continue the message (PyTorch
wraps long messages over several lines).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# How a paste was wrapped: Markdown inline code, bold, quotes around a message.
_WRAP_PATTERN = r"^(?:`+|\*\*|''|\"(?=[A-Za-z]))"
# Each prefix pattern is tried at the start of the line until none applies. A named group
# `rank` gives the rank; `level` the log level.
_LEVELS = r"DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL"
_PREFIXES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"^\[(?:rank|Rank|RANK)\s*(?P<rank>\d+)\]:? ?",
        r"^\[[A-Za-z_]*?(?P<rank>\d+)\]: ?",
        r"^(?P<rank>\d{1,5}): ",
        r"^\[?\d{4}-\d{2}-\d{2}[ T_]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?"
        r"\s*(?:[-|:]\s+)?",
        r"^\[?\d{2}:\d{2}:\d{2}(?:[.,-]\d+)?\]?\s+(?:[-|]\s+)?",
        rf"^\|?\s*\[?(?P<level>{_LEVELS})\]?(?:\s*\|\s*[\w.<>]+:[\w<>]+:\d+\s*-\s*"
        r"|:[\w.<>-]+:|\s*[:|-]\s*|\s+)",
        r"^(?P<level>[IWEFV])\d{3,4}\s+\d{2}:\d{2}:\d{2}\.\d+\s+\d+\s+[\w./-]+:\d+\]\s*",
        r"^\[(?P<level>[IWEFV])(?:\d{3,4}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:\s+\d+)?)?\s*"
        r"[\w./-]+\.(?:cpp|cc|h|hpp|cu|py):\d+\]\s*",
        r"^[\w.-]+:\d+:\d+\s+\[\d+\]\s+",
        r"^E\s{3,}",
        # vLLM and similar: "(EngineCore_DP0 pid=3208) ERROR 04-27 12:56:07 [core.py:968] ".
        r"^\((?:\w+ )?pid=\d+\)\s*",
        r"^\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?\s+(?:\[[\w./-]+:\d+\]|[\w./-]+:\d+\])\s*",
        # Line numbers of a saved log ("[80746] [rank0]:...") and job-system prefixes
        # ("fa88a9df || ").
        r"^\[\d{2,}\]\s+(?=\S)",
        r"^[0-9a-f]{8}\s+\|\|\s+",
        # How the paste was wrapped: Markdown quotes, inline code, bold; ComfyUI's banner.
        r"^>\s?(?=\S)",
        _WRAP_PATTERN,
        r"^!!! Exception during processing !!!\s*",
    )
)
_WRAP = _PREFIXES[-2]
_TRAILING_WRAP = re.compile(r"(?:`+|\*\*|''|\"(?:\.)?)$")
# Rich's boxed tracebacks ("│ ❱ 2267 │   return ... │"), whose box is not part of the text.
_BOX = re.compile(r"^[│┃]\s?|\s*[│┃]$")
# Info and debug records are never the error. Warning records are candidates like any line
# (torch logs recompilation limits and NCCL trouble as warnings) unless they are warnings in
# the Python or c10 format ("UserWarning: ...", "[W reducer.cpp:1389] Warning: ...").
_NOISE_LEVELS = {"DEBUG", "INFO", "I"}
_C10_WARNING = re.compile(r"^Warning: ")
_PY_WARNING = re.compile(r"^(?:.*?:\d+:\s*)?[A-Z]\w*Warning:\s")
_NCCL_INFO = re.compile(r"^NCCL INFO\b")
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*)(?:\s*:(?:\s+(?P<message>.*)|\s*$)|\s*$)"
)
_EXCEPTION_SUFFIXES = (
    "Error",
    "Exception",
    "Interrupt",
    "Exit",
    "Failure",
    "Unsupported",
    "Failed",
    "Exhausted",
)
TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_CHAINED = re.compile(
    r"^(During handling of the above exception|The above exception was the direct cause)"
)
FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S+))?')
_CELL = re.compile(r"^\s*(?:Cell In\s*\[\d+\]|Input In \[\d+\]), line (?P<line>\d+)")
LIBRARY = re.compile(
    r"site-packages|dist-packages|[/\\]lib[/\\]python\d|[/\\]torch[/\\]|<frozen|importlib"
)

MAX_BLOCK_LINES = 30
# Widths at which terminals (and tmux, screen, a CI log viewer) hard-wrap long lines.
TERMINAL_WIDTHS = (80, 100, 120, 132, 160, 200)
MIN_WRAP_WIDTH = 60
MAX_LINE_CHARS = 200_000  # longer lines are cut (a state_dict key list of a huge model fits)
MAX_PLAIN_CANDIDATES = 4000


@dataclass(frozen=True)
class Line:
    """A line of the text: `text` without its prefixes, `noise` for warnings and info records
    (never the error), `hint` for the advice a library prints next to an error ("Set
    TORCHDYNAMO_VERBOSE=1 ...", "If you encounter CUDA out of memory, ..."), which names
    errors without being one."""

    index: int
    text: str
    raw: str
    rank: int | None = None
    noise: bool = False
    hint: bool = False


@dataclass(frozen=True)
class TextBlock:
    """An error message: its first line and the lines that continue it."""

    lines: tuple[Line, ...]
    exception: str | None = None

    @property
    def start(self) -> int:
        return self.lines[0].index

    @property
    def rank(self) -> int | None:
        return self.lines[0].rank

    def _pieces(self) -> list[tuple[str, str]]:
        """Each line's text and what joins it to the one before: a space, or nothing where a
        terminal cut a word at its width (the line before is exactly as long as a terminal is
        wide, or as long as another line of the block, and ends inside a word)."""
        raws = [line.raw.rstrip("\r\n") for line in self.lines]
        longest = max(len(r) for r in raws)
        widths = set(TERMINAL_WIDTHS)
        if longest >= MIN_WRAP_WIDTH and sum(len(r) == longest for r in raws[:-1]) >= 2:
            widths.add(longest)
        out: list[tuple[str, str]] = []
        for i, line in enumerate(self.lines):
            piece = line.text.strip()
            if i == 0:
                out.append((piece, ""))
                continue
            before = raws[i - 1]
            cut = (
                len(before) in widths
                and before[-1:].isalnum()
                and line.text[:1].isalnum()
                and line.raw[:1].isalnum()
            )
            out.append((piece, "" if cut else " "))
        return out

    @property
    def text(self) -> str:
        return "".join(sep + piece for piece, sep in self._pieces())

    def line_at(self, offset: int) -> Line:
        """The line holding the character at `offset` of `text`."""
        pos = 0
        pieces = self._pieces()
        for i, line in enumerate(self.lines):
            following = pieces[i + 1][1] if i + 1 < len(pieces) else " "
            pos += len(pieces[i][0]) + len(following)
            if offset < pos:
                return line
        return self.lines[-1]


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str | None
    code: str | None

    @property
    def library(self) -> bool:
        return bool(LIBRARY.search(self.file))

    def describe(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where} in {self.func}" if self.func else where


# A progress bar redrawn with carriage returns leaves the next rank's line glued to it once
# the log is pasted: "  0%|     | 0/3100 [00:00<?, ?it/s][rank1]: Traceback (most recent ...".
_GLUED = re.compile(r"^.*?(?:it/s|s/it)\]\s*(?=\[(?:rank|Rank|RANK)\s*\d+\]:)")


def _strip(raw: str) -> tuple[str, int | None, str | None]:
    text = _ANSI.sub("", raw).rstrip().replace("\t", "    ")
    text = _GLUED.sub("", text, count=1)
    if text[:1] in "│┃":
        text = _BOX.sub("", text)
    rank: int | None = None
    level: str | None = None
    wrapped = False
    for _ in range(10):
        for pattern in _PREFIXES:
            m = pattern.match(text)
            if m and m.end() > 0:
                wrapped = wrapped or pattern is _WRAP
                groups = m.groupdict()
                if groups.get("rank") is not None and rank is None:
                    rank = int(groups["rank"])
                if groups.get("level"):
                    level = groups["level"]
                text = text[m.end() :]
                break
        else:
            break
    if wrapped:
        text = _TRAILING_WRAP.sub("", text.rstrip())
    return text, rank, level


_HINT = re.compile(
    r"^(?:If (?:you|reserved|the|this|recompilations)\b|Set (?:TORCH|the environment)"
    r"|You can (?:suppress|set|enable|try)|For (?:debugging|more information|even more"
    r"|extended logs|C\+\+ stack trace)|To (?:log|diagnose|enable|debug|monitor)\b"
    r"|Please (?:report|refer|see|try|make sure|check the|consider)\b|Hint:|HINT:"
    r"|Consider (?:using|setting|increasing|passing)\b|Compile with `TORCH_USE_CUDA_DSA`"
    r"|CUDA kernel errors might be|See (?:documentation|the documentation|https?://))"
)
# A whole traceback logged as one line, its newlines escaped (wandb, repr() of an exception).
_ESCAPED_NEWLINES = re.compile(r"\\n(?=\s|Traceback|File |Original|[A-Z]\w*(?:Error|Exception))")


def _unescape(text: str) -> str:
    if "\\n" not in text:
        return text
    out = []
    for raw in text.splitlines():
        if len(_ESCAPED_NEWLINES.findall(raw)) >= 2 and "Traceback" in raw:
            raw = _ESCAPED_NEWLINES.sub("\n", raw)
        out.append(raw)
    return "\n".join(out)


def clean(text: str) -> list[Line]:
    """Every line with its prefixes removed, its rank when a prefix named one, and whether it
    is noise (a warning or an info record: never the error that matters) or a hint."""
    out: list[Line] = []
    in_warning = False
    for index, raw in enumerate(_unescape(text).splitlines()):
        body, rank, level = _strip(raw[:MAX_LINE_CHARS])
        noise = False
        if level is not None and level in _NOISE_LEVELS:
            noise = True
        if _C10_WARNING.match(body) and level is not None:
            noise = True
        if _PY_WARNING.match(body) or _NCCL_INFO.match(body):
            noise = True
            in_warning = True
        elif in_warning and body[:1] in (" ", "") and body.strip() and not TRACEBACK.search(body):
            noise = True  # the source line (and forward trace) under a Python warning
        else:
            in_warning = noise and in_warning
        out.append(Line(index, body, raw, rank, noise, bool(_HINT.match(body.strip()))))
    return out


def exception_name(line: str) -> str | None:
    m = _EXCEPTION.match(line.strip())
    if m is None or not m.group("name").endswith(_EXCEPTION_SUFFIXES):
        return None
    return m.group("name")


def _ends_block(first: Line, line: Line) -> bool:
    body = line.text
    if not body.strip():
        return True
    if TRACEBACK.search(body) or _CHAINED.match(body.strip()) or FRAME.match(body):
        return True
    return first.rank is not None and line.rank is not None and line.rank != first.rank


def block_at(lines: list[Line], index: int) -> TextBlock:
    first = lines[index]
    taken = [first]
    for line in lines[index + 1 : index + MAX_BLOCK_LINES]:
        if _ends_block(first, line):
            break
        if line.noise:
            continue
        taken.append(line)
    return TextBlock(tuple(taken), exception_name(first.text))


def candidates(
    lines: list[Line], limit: int = MAX_PLAIN_CANDIDATES
) -> tuple[list[TextBlock], list[Line]]:
    """Exception blocks from the last to the first, then every other line (last first, at most
    `limit` of them; `block_at` gives the block of one that matters)."""
    exceptions: list[TextBlock] = []
    plain: list[Line] = []
    for line in reversed(lines):
        if line.noise or not line.text.strip():
            continue
        if exception_name(line.text) is not None:
            exceptions.append(block_at(lines, line.index))
        elif len(plain) < limit and not line.hint:
            plain.append(line)
    return exceptions, plain


def _traceback_body(body: str) -> bool:
    """A line that can sit between "Traceback (most recent call last):" and its exception."""
    return (
        not body.strip()
        or body[:1].isspace()
        or bool(_CELL.match(body))
        or bool(FRAME.match(body))
        or body.startswith(("---->", "File ~", "[... skipping"))
    )


def frames_before(lines: list[Line], index: int) -> list[Frame]:
    """The frames of the traceback whose exception line is at `index` (outermost first);
    empty when no frames lead up to the line. A pasted traceback may lack its header."""
    i = index - 1
    while i >= 0 and index - i < 5000:
        body = lines[i].text
        if TRACEBACK.search(body) or not _traceback_body(body):
            break
        i -= 1
    frames: list[Frame] = []
    for j in range(i + 1, index):
        body = lines[j].text
        m = FRAME.match(body)
        if m:
            code = lines[j + 1].text.strip() if j + 1 < index else None
            if code and (FRAME.match(lines[j + 1].text) or set(code) <= set("^~ ")):
                code = None
            frames.append(Frame(m.group("file"), int(m.group("line")), m.group("func"), code))
            continue
        c = _CELL.match(body)
        if c:
            frames.append(Frame("<notebook cell>", int(c.group("line")), None, None))
    return frames


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame in the user's own code (not torch, not site-packages)."""
    for frame in reversed(frames):
        if not frame.library:
            return frame
    return None
