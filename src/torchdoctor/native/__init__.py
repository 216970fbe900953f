"""torchdoctor's compiled part: a Python module built from the C++ here, for the places where
Python costs too much per call: the kernel that records python.collectives (collectives.cpp,
its Python half telemetry/collectives_native.py), the step's gradient norm of a few small
tensors (squares.cpp: sum_of_squares, and grad_squares that reads them from the parameters),
the phase timer the hooks call a few times a step (phases.cpp: PhaseTimer, the same as
telemetry/phases.py's), and the steady step's handlers and hooks (steady.cpp: SteadyStep,
telemetry/steady.py).

Optional: used wherever it is built (TORCHDOCTOR_NATIVE=0 turns it off). Built once per torch
and Python version, by `python -m torchdoctor.native` (which `make install`, `make test` and
`make bench` run), with the system's C++ compiler, into a private cache directory. Without it,
collective tracing runs its Python kernel (telemetry/collectives.py): the same rows, at several
times the cost per call (docs/benchmarks.md), sum_of_squares and grad_squares answer None
(the caller asks torch), scalar_value None (the loss is read with .item()), the phase timer
is telemetry/phases.py's own, and no step is steady (every step takes the Recorder's general
path, with the Python hooks).
Nothing is ever compiled inside a training process: a probe only loads what is built.

The boundary is typed: the module's functions (listed once, with their signatures, in
module.cpp) are `Kernels` below; the journal line the kernel writes has the layout of
store/journal.py and the schema, through the header generated from them (layout.py).

Where the library goes: $TORCHDOCTOR_NATIVE_DIR, else $XDG_CACHE_HOME/torchdoctor/native
(~/.cache/torchdoctor/native), in a directory named by a hash of the sources, the generated
layout, torch's version and the interpreter's; it is loaded only from a directory of the user's
own that nobody else may write (a library is code: another user's would run in the training
process).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from torchdoctor.native import layout

HERE = Path(__file__).parent
# compiled each on its own (in parallel), then linked; -O3 where a loop is worth vectorizing
UNITS = {
    "collectives.cpp": "-O2",
    "squares.cpp": "-O3",
    "phases.cpp": "-O2",
    "steady.cpp": "-O2",
    "module.cpp": "-O2",
}
HEADERS = ("native.h",)
LIBRARY = "_kernels.so"
MODULE = "torchdoctor.native._kernels"  # module.cpp's PyInit__kernels


class Kernels(Protocol):
    """The compiled module's functions (module.cpp), as Python sees them."""

    def register(self, ops: list[tuple[str, str, int, int, int, bool, bool]], /) -> bool: ...
    def unregister(self) -> None: ...
    def configure(
        self,
        *,
        step: Callable[[], int | None],
        journal: Callable[[], str | None],
        group: Callable[[str, int], tuple[str, list[int], int] | None],
        file_kind: Callable[[str], int],
        backward_site: Callable[[], str | None],
    ) -> None: ...
    def enable(self, on: bool, /) -> None: ...
    def set_bounds(self, works: int, nbytes: int, /) -> None: ...
    def poll(self, errors: bool, /) -> int: ...
    def close(self) -> None: ...
    def take_failure(self) -> str: ...
    def sum_of_squares(self, tensors: Sequence[Any], /) -> float | None: ...
    def grad_squares(self, params: list[Any], limit: int, /) -> tuple[float, int] | None: ...
    def scalar_value(self, tensor: Any, /) -> float | None: ...
    def PhaseTimer(self) -> object: ...  # telemetry/phases.py's PhaseTimer (phases.cpp)
    def SteadyStep(self, recorder: Any, parts: Any) -> Any: ...  # telemetry/steady.py (steady.cpp)


class BuildError(Exception):
    """The kernel could not be built; the message says why and what to install."""


def cache_root() -> Path:
    explicit = os.environ.get("TORCHDOCTOR_NATIVE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchdoctor" / "native"


def _key() -> str:
    import torch

    digest = hashlib.sha256()
    for name in (*UNITS, *HEADERS):
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    digest.update(repr(sorted(UNITS.items())).encode())
    for text in layout.headers().values():
        digest.update(text.encode())
    for part in (torch.__version__, sys.version, sys.platform, str(_cxx11_abi())):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:16]


def _cxx11_abi() -> int:
    import torch

    return int(bool(getattr(torch, "compiled_with_cxx11_abi", lambda: True)()))


def library_path() -> Path:
    return cache_root() / _key() / LIBRARY


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def build(force: bool = False) -> Path:
    """Compile the module for this torch and Python (a few seconds a unit, in parallel); its
    path. Raises BuildError with the reason."""
    target = library_path()
    if target.exists() and not force:
        return target
    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (g++, c++ or clang++; or set CXX)")
    import torch

    torch_dir = Path(torch.__file__).parent
    include = torch_dir / "include"
    python_include = sysconfig.get_paths()["include"]
    if not (include / "torch" / "library.h").exists():
        raise BuildError(f"this torch has no C++ headers ({include})")
    if not Path(python_include, "Python.h").exists():
        raise BuildError(f"Python's headers are missing ({python_include}): install python3-dev")
    _private_dir(target.parent)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        work = Path(scratch)
        for file_name, text in layout.headers().items():
            (work / file_name).write_text(text)
        flags = [
            "-fPIC", "-std=c++17", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={_cxx11_abi()}",
            f"-I{work}", f"-I{HERE}", f"-I{include}",
            f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", f"-I{python_include}",
        ]  # fmt: skip
        objects = {unit: work / f"{Path(unit).stem}.o" for unit in UNITS}
        compiles = {
            unit: subprocess.Popen(
                [cxx, level, *flags, "-c", str(HERE / unit), "-o", str(objects[unit])],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            for unit, level in UNITS.items()
        }  # fmt: skip
        said = {unit: process.communicate()[1] for unit, process in compiles.items()}
        failed = [f"{u}:\n{said[u].strip()[-3000:]}" for u, p in compiles.items() if p.returncode]
        if failed:
            raise BuildError(f"{cxx} failed on " + "\n".join(failed))
        out = work / LIBRARY
        lib = torch_dir / "lib"
        link = [
            cxx, "-shared", *map(str, objects.values()), "-o", str(out), f"-L{lib}",
            "-lc10", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{lib}",
        ]  # fmt: skip
        done = subprocess.run(link, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"{cxx} failed:\n{done.stderr.strip()[-4000:]}")
        os.replace(out, target)  # whole or not at all: a probe may look at the same moment
    return target


def _private_dir(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=0o700, exist_ok=True)
    if not _trusted_dir(path):
        raise BuildError(f"{path} is not a private directory of this user's")


def built() -> Path | None:
    """The built kernel for this torch and Python, if there is one that is safe to load."""
    try:
        path = library_path()
        if not path.is_file():
            return None
    except Exception:
        return None
    return path if _trusted(path) else None


def _trusted(path: Path) -> bool:
    """Ours, and neither it nor its directory writable by anyone else."""
    return _trusted_dir(path) and _trusted_dir(path.parent)


def _trusted_dir(path: Path) -> bool:
    st = path.stat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


_loaded: list[Kernels | None] = []


def load() -> Kernels | None:
    """The compiled module, loaded into this process once, where it is built (None where it
    is not, or with TORCHDOCTOR_NATIVE=0)."""
    if _loaded:
        return _loaded[0]
    kernels = None
    if os.environ.get("TORCHDOCTOR_NATIVE", "1").strip() != "0":
        path = built()
        if path is not None:
            loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
            spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
            assert spec is not None
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            kernels = cast(Kernels, module)
    _loaded.append(kernels)
    return kernels


def _not_built(tensors: Sequence[Any]) -> float | None:
    """sum_of_squares where the module is not built: torch is asked instead."""
    return None


def _grads_not_built(params: list[Any], limit: int) -> tuple[float, int] | None:
    """grad_squares where the module is not built: torch is asked instead."""
    return None


def _scalar_not_built(tensor: Any) -> float | None:
    """scalar_value where the module is not built: the caller asks .item()."""
    return None


if TYPE_CHECKING:

    def sum_of_squares(tensors: Sequence[Any]) -> float | None:
        """The sum of the squares of every element of `tensors` (CPU, dense, contiguous
        float32/float64/bfloat16/float16 tensors or Parameters), accumulated in double, in one
        call without torch's dispatch; NaN and Inf come through as in a norm. None for anything
        else (another device, sparse, not contiguous, a subclass such as DTensor, an integer
        dtype), or where the module is not built: the caller asks torch then."""

    def grad_squares(params: list[Any], limit: int) -> tuple[float, int] | None:
        """(the sum of the squares of the gradients of `params`, as sum_of_squares reads them;
        how many of them have a gradient). None when a parameter is a subclass (DTensor), a
        gradient cannot be read so, they hold more than `limit` elements, or the module is not
        built: the caller collects the gradients in Python then."""

    def scalar_value(tensor: Any) -> float | None:
        """The value of a one-element tensor as .item() gives it, read in place (no dispatch);
        None for one sum_of_squares could not read, or where the module is not built."""


_FALLBACKS: dict[str, Callable[..., Any]] = {
    "sum_of_squares": _not_built,
    "grad_squares": _grads_not_built,
    "scalar_value": _scalar_not_built,
}


def __getattr__(name: str) -> Any:
    # sum_of_squares, grad_squares, scalar_value: the compiled function itself
    # (no Python frame between the caller and it), bound at the first use, or its fallback
    fallback = _FALLBACKS.get(name)
    if fallback is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    kernels = load()
    function = getattr(kernels, name) if kernels is not None else fallback
    globals()[name] = function
    return function
