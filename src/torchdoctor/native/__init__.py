"""torchdoctor's compiled part: the C++ kernel that records python.collectives (collectives.cpp).

Optional: used wherever it is built (TORCHDOCTOR_NATIVE=0 turns it off). Built once per torch
and Python version, by `python -m torchdoctor.native` (which `make install`, `make test` and
`make bench` run), with the system's C++ compiler, into a private cache directory. Without it,
collective tracing runs its Python kernel (telemetry/collectives.py): the same rows, at several
times the cost per call (docs/benchmarks.md). Nothing is ever compiled inside a training
process: a probe only loads what is built already.

Where the library goes: $TORCHDOCTOR_NATIVE_DIR, else $XDG_CACHE_HOME/torchdoctor/native
(~/.cache/torchdoctor/native), in a directory named by a hash of the source, torch's version and
the interpreter's; it is loaded only from a directory of the user's own that nobody else may
write (a library is code: another user's would run in the training process).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("collectives.cpp")
LIBRARY = "collectives.so"


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

    digest = hashlib.sha256(SOURCE.read_bytes())
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
    """Compile the kernel for this torch and Python (a few seconds); its path. Raises
    BuildError with the reason."""
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
        out = Path(scratch) / LIBRARY
        command = [
            cxx, "-O2", "-shared", "-fPIC", "-std=c++17", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={_cxx11_abi()}",
            f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
            f"-I{python_include}", str(SOURCE), "-o", str(out),
            f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_dir / 'lib'}",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
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


_loaded: list[ctypes.PyDLL] = []


def load() -> ctypes.PyDLL | None:
    """The kernel's library, loaded into this process once, where it is built (None where it
    is not, or with TORCHDOCTOR_NATIVE=0)."""
    if _loaded:
        return _loaded[0]
    if os.environ.get("TORCHDOCTOR_NATIVE", "1").strip() == "0":
        return None
    path = built()
    if path is None:
        return None
    lib = ctypes.PyDLL(str(path))  # its functions that take Python objects hold the GIL
    _declare(lib)
    _loaded.append(lib)
    return lib


def _declare(lib: ctypes.PyDLL) -> None:
    c = ctypes
    lib.td_add_op.argtypes = [c.c_char_p, c.c_char_p, c.c_int, c.c_int, c.c_int, c.c_int, c.c_int]
    lib.td_register.restype = c.c_int
    lib.td_configure.argtypes = [c.py_object] * 5
    lib.td_enable.argtypes = [c.c_int]
    lib.td_set_bounds.argtypes = [c.c_long, c.c_long]
    lib.td_open.argtypes = [c.c_char_p]
    lib.td_take_failure.restype = c.c_char_p


def poll_function(lib: ctypes.PyDLL) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    """td_poll without the GIL (works may take a while to answer; other threads go on)."""
    poll = ctypes.CDLL(lib._name).td_poll
    poll.argtypes = [ctypes.c_int]
    poll.restype = ctypes.c_int
    return poll
