"""`torchdoctor [ENDPOINT] VERB [ARGS]`: parse, dispatch to the verb's module, map errors to
exit codes. This is the only place that turns exceptions into messages and codes.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from torchdoctor._version import __version__
from torchdoctor.cli.context import Context
from torchdoctor.cli.errors import OK, USAGE, CliError
from torchdoctor.report import formats

# Every verb, in the order `torchdoctor --help` lists them. Each names a module in
# torchdoctor.cli.commands with NAME, SUMMARY, TARGET ("live", "optional" or "none"),
# FORMATS (its kind of output from report/formats.py, when it prints data), configure(parser)
# and main(args, ctx) -> int. Modules are imported only when used, so
# `explain` and `lint` start without importing torch.
COMMANDS: tuple[str, ...] = (
    "run",
    "attach",
    "backtrace",
    "eval",
    "query",
    "tables",
    "diagnoses",
    "shapes",
    "memory",
    "report",
    "export",
    "metrics",
    "list",
    "cluster",
    "explain",
    "ckpt",
    "lint",
    "batch-size",
    "overfit",
    "repro",
    "compare",
    "demo",
)

USAGE_TEXT = """\
usage: torchdoctor [-t ENDPOINT] [ENDPOINT] VERB [ARGS...]

ENDPOINT is a pid, a socket path or HOST:PORT; with one probed process of yours it may be
left out. Verbs:
{verbs}

Exit codes: 0 success, 1 the target reported an error, 2 usage or connection error.
`torchdoctor VERB --help` tells more about a verb.
"""


def command(name: str) -> ModuleType:
    return importlib.import_module(f"torchdoctor.cli.commands.{name.replace('-', '_')}")


def _usage() -> str:
    lines = []
    for name in COMMANDS:
        lines.append(f"  {name:<10} {command(name).SUMMARY}")
    return USAGE_TEXT.format(verbs="\n".join(lines))


def _split_globals(argv: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """Leading global options (-t/--target, --token, --timeout) and the rest."""
    opts: dict[str, str | None] = {"target": None, "token": None, "timeout": None}
    names = {"-t": "target", "--target": "target", "--token": "token", "--timeout": "timeout"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if key in names:
            if not eq:
                if i + 1 >= len(argv):
                    raise CliError(f"{arg} needs a value")
                value = argv[i + 1]
                i += 1
            opts[names[key]] = value
            i += 1
            continue
        break
    return opts, argv[i:]


def add_common(
    parser: argparse.ArgumentParser, target: bool, choices: tuple[str, ...] | None
) -> None:
    if target:
        parser.add_argument("-t", "--target", dest="target", metavar="ENDPOINT")
        parser.add_argument("--token", help="token of a TCP endpoint (or TORCHDOCTOR_TOKEN)")
        parser.add_argument("--timeout", type=float, metavar="SECONDS")
    if choices:
        formats.add(parser, choices)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise CliError(f"{self.prog}: {message}")


def dispatch(argv: list[str]) -> int:
    opts, rest = _split_globals(argv)
    if not rest or rest[0] in ("-h", "--help", "help"):
        print(_usage(), end="")
        return OK if rest else USAGE
    if rest[0] in ("-V", "--version"):
        print(f"torchdoctor {__version__}")
        return OK
    endpoint = opts["target"]
    if rest[0] not in COMMANDS:
        if rest[0].startswith("-"):
            raise CliError(f"unknown option {rest[0]!r}; see `torchdoctor --help`")
        if endpoint is not None:
            raise CliError(f"two endpoints given: {endpoint!r} and {rest[0]!r}")
        endpoint, rest = rest[0], rest[1:]
        more, rest = _split_globals(rest)  # `torchdoctor PID --timeout 5 query ...`
        opts.update({k: v for k, v in more.items() if v is not None})
        if opts["target"] not in (None, endpoint):
            raise CliError(f"two endpoints given: {endpoint!r} and {opts['target']!r}")
        if not rest or rest[0] not in COMMANDS:
            what = repr(rest[0]) if rest else "nothing"
            raise CliError(f"expected a verb after ENDPOINT {endpoint!r}, got {what}")
    name, verb_args = rest[0], rest[1:]
    module = command(name)
    if endpoint is not None and module.TARGET == "none":
        raise CliError(f"`{name}` does not talk to a process; drop the ENDPOINT")
    parser = _Parser(prog=f"torchdoctor {name}", description=module.SUMMARY)
    add_common(parser, module.TARGET != "none", getattr(module, "FORMATS", None))
    module.configure(parser)
    parse = getattr(module, "parse_argv", None)
    args = parse(parser, verb_args) if parse else parser.parse_args(verb_args)
    target = getattr(args, "target", None)
    if target is not None and endpoint is not None and target != endpoint:
        raise CliError(f"two endpoints given: {endpoint!r} and {target!r}")
    timeout = getattr(args, "timeout", None) or (
        float(opts["timeout"]) if opts["timeout"] else None
    )
    ctx = Context(endpoint or target, getattr(args, "token", None) or opts["token"], timeout)
    return int(module.main(args, ctx))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return dispatch(list(sys.argv[1:] if argv is None else argv))
    except CliError as exc:
        print(f"torchdoctor: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `torchdoctor ... | head`
        return OK


def entry() -> None:
    sys.exit(main())
