"""Run a script or module as `python SCRIPT` / `python -m MODULE` would, inside this process.

`__main__` is the script's own module, `sys.argv` its arguments, `sys.path[0]` its directory;
SystemExit gives the exit code; an uncaught exception prints its traceback and exits 1, and
KeyboardInterrupt ends the process by SIGINT, as Python itself does.
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import sys
import types
from collections.abc import Callable

from torchdoctor.cli.errors import CliError


def split_options(
    argv: list[str], valued: set[str], switches: set[str], verb: str
) -> tuple[list[str], list[str]]:
    """torchdoctor's options, and the script (or -m MODULE) with its own arguments, which are
    never parsed by us: options go before the script. `valued` options take a value (`-m`
    ends ours: the module and what follows are the script's)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        key = arg.partition("=")[0]
        if key in valued:
            i += 1 if "=" in arg else 2
            if key == "-m":
                break
        elif arg in switches:
            i += 1
        elif arg.startswith("-") and arg != "-":
            raise CliError(f"{verb}: unknown option {arg!r} (options go before the script)")
        else:
            break
    return argv[:i], argv[i:]


@dataclasses.dataclass
class Outcome:
    code: int  # the exit code the process should end with
    exception: BaseException | None = None  # an uncaught exception, already printed
    interrupted: bool = False  # ended by KeyboardInterrupt


def exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1


Silent = tuple[type[BaseException], ...]


def fresh_main() -> types.ModuleType:
    """A `__main__` module as the interpreter makes it at start-up, before it runs anything:
    the same names in the same order (a script that prints `globals()` sees no difference)."""
    import builtins
    import importlib.machinery

    module = types.ModuleType("__main__")
    namespace = module.__dict__
    namespace["__package__"] = None
    namespace["__loader__"] = importlib.machinery.BuiltinImporter
    namespace["__spec__"] = None
    namespace["__annotations__"] = {}
    namespace["__builtins__"] = builtins
    sys.modules["__main__"] = module
    return module


def run_script(path: str, args: list[str], silent: Silent = ()) -> Outcome:
    """As `python PATH ARGS` (CPython's pymain_run_file): `__file__` is PATH made absolute
    (not normalised), the code is compiled under that name (tracebacks show it), `__loader__`
    a SourceFileLoader, `__cached__` None, `sys.path[0]` the resolved script's directory and
    `sys.argv[0]` PATH as typed."""
    import importlib.machinery

    if not os.path.exists(path):
        raise FileNotFoundError(f"can't open file {path!r}: No such file or directory")
    filename = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, filename, "exec", dont_inherit=True)
    module = fresh_main()
    namespace = module.__dict__
    namespace["__file__"] = filename
    namespace["__cached__"] = None
    namespace["__loader__"] = importlib.machinery.SourceFileLoader("__main__", filename)
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    return _guard(lambda: exec(code, namespace), silent)


def run_module(name: str, args: list[str], silent: Silent = ()) -> Outcome:
    """As `python -m NAME ARGS`: runpy's own entry for -m, in a fresh `__main__`."""
    fresh_main()
    sys.argv = [name, *args]  # runpy puts the module's file in argv[0], as -m does
    sys.path[0] = os.getcwd()
    run_as_main = runpy._run_module_as_main  # type: ignore[attr-defined]
    return _guard(lambda: run_as_main(name, alter_argv=True), silent)


def _guard(body: Callable[[], object], silent: Silent = ()) -> Outcome:
    """`silent`: exceptions that end the script on purpose (a recipe's stop): not printed."""
    try:
        body()
    except SystemExit as exc:
        return Outcome(exit_code(exc))
    except KeyboardInterrupt as exc:
        _print(exc)
        return Outcome(130, exc, interrupted=True)
    except BaseException as exc:
        if not isinstance(exc, silent):
            _print(exc)
        return Outcome(1, exc)
    return Outcome(0)


def _print(exc: BaseException) -> None:
    """The traceback as Python prints it: from the script's own first frame, without ours."""
    from torchdoctor.frames import drop_own_frames

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OURS:
        tb = tb.tb_next
    tb = drop_own_frames(tb)
    exc.__traceback__ = tb
    sys.excepthook(type(exc), exc, tb)


_OURS = {__file__, runpy.__file__}
