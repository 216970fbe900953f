"""What this machine runs, read without importing torch: the versions of the packages an error
depends on and the builds they are (torch's CUDA, the torch torchvision was built for), the
GPUs and the driver, the pins of the project's requirements, and the files an error names.

`torchdoctor explain --here` rules causes in or out with these facts (a torchvision built for
another torch, a driver older than the build's CUDA, a 0-byte checkpoint). Every reader is
bounded: nvidia-smi runs with a timeout, files are only stat'ed, nothing is imported.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

# The packages whose versions decide causes (and the name of their module, for version.py).
PACKAGES = (
    "torch",
    "torchvision",
    "torchaudio",
    "triton",
    "numpy",
    "transformers",
    "peft",
    "accelerate",
    "deepspeed",
    "flash-attn",
    "xformers",
    "bitsandbytes",
    "safetensors",
)
# Packages built against one torch release: their metadata pins it.
BUILT_FOR_TORCH = ("torchvision", "torchaudio")
SMI_TIMEOUT = 5.0
MAX_FILES = 8
_VERSION_PY = re.compile(
    r"^(?P<name>__version__|cuda|hip)\s*(?::[^=\n]*)?=\s*(?:'(?P<a>[^']*)'|\"(?P<b>[^\"]*)\"|None)",
    re.MULTILINE,
)
_PIN = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*(?:\[[^\]]*\])?\s*(==|~=|>=|<=|<|>)\s*([\w.*+!-]+)")
_SMI_CUDA = re.compile(r"CUDA Version:\s*(\d+\.\d+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def version_tuple(version: str | None) -> tuple[int, ...]:
    """'2.5.1+cu124' -> (2, 5, 1); '12.8' -> (12, 8); '' -> ()."""
    if not version:
        return ()
    out = []
    for part in re.split(r"[.+]", version.split("+")[0]):
        m = re.match(r"\d+", part)
        if m is None:
            break
        out.append(int(m.group()))
    return tuple(out)


def _installed(name: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    except Exception:  # a broken dist-info must not break explain
        return None


def _version_py(module: str) -> dict[str, str | None]:
    """`module`/version.py as torch and its companions write it ({'__version__': ..., 'cuda':
    '12.4' or None}), read as text: finding the spec of a top-level package imports nothing."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return {}
    if spec is None or not spec.submodule_search_locations:
        return {}
    for location in spec.submodule_search_locations:
        path = Path(location) / "version.py"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")[:20_000]
        except OSError:
            continue
        return {
            m["name"]: m["a"] if m["a"] is not None else m["b"] for m in _VERSION_PY.finditer(text)
        }
    return {}


def torch_build() -> dict[str, str | None]:
    """torch's version and the CUDA (or ROCm) it was built for ('cpu' for neither), read from
    its version.py without importing it; {} when torch is not installed."""
    info = _version_py("torch")
    if not info:
        return {}
    cuda, hip = info.get("cuda"), info.get("hip")
    return {
        "version": info.get("__version__"),
        "cuda": cuda,
        "build": f"cuda {cuda}" if cuda else f"rocm {hip}" if hip else "cpu",
    }


def _torch_pin(dist: importlib.metadata.Distribution) -> str | None:
    """The torch version a companion's metadata requires ('2.5.1' from 'torch==2.5.1')."""
    for req in dist.requires or ():
        m = re.match(r"^\s*torch\s*\(?\s*==\s*([\w.+]+)", req)
        if m:
            return m.group(1)
    return None


def _companion_torch(name: str, version: str) -> str | None:
    """The torch minor release a torchvision/torchaudio release goes with, by the numbering both
    have kept since torch 2.0 (torchvision 0.15 + N: torch 2.N; torchaudio 2.N: torch 2.N)."""
    v = version_tuple(version)
    if len(v) < 2:
        return None
    if name == "torchvision" and v[0] == 0 and v[1] >= 15:
        return f"2.{v[1] - 15}"
    if name == "torchaudio" and v[0] == 2:
        return f"2.{v[1]}"
    return None


def packages() -> dict[str, Any]:
    """Installed versions, the torch builds (CUDA or CPU) and what the companions were built for."""
    out: dict[str, Any] = {"versions": {}, "builds": {}, "built_for_torch": {}}
    for name in PACKAGES:
        dist = _installed(name)
        if dist is None:
            continue
        out["versions"][name] = dist.version
        if name in ("torch", *BUILT_FOR_TORCH):
            info = _version_py(name)
            if info:
                cuda, hip = info.get("cuda"), info.get("hip")
                out["builds"][name] = f"cuda {cuda}" if cuda else f"rocm {hip}" if hip else "cpu"
        if name in BUILT_FOR_TORCH:
            pin = _torch_pin(dist)
            if pin is not None:
                out["built_for_torch"][name] = {"torch": pin, "from": "metadata"}
            else:
                minor = _companion_torch(name, dist.version)
                if minor is not None:
                    out["built_for_torch"][name] = {"torch": minor, "from": "release numbering"}
    return out


def _run(cmd: list[str], timeout: float) -> str | None:
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def gpus(timeout: float = SMI_TIMEOUT) -> dict[str, Any]:
    """The NVIDIA GPUs and driver as nvidia-smi reports them; `smi` says whether it could."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"smi": "absent", "gpus": []}
    fields = "index,name,driver_version,memory.total,compute_cap"
    query = [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
    listing = _run(query, timeout)
    if listing is None:  # drivers older than 510 know no compute_cap
        fields = fields.rsplit(",", 1)[0]
        listing = _run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], timeout)
    if listing is None:
        return {"smi": "failed", "gpus": []}
    found = []
    driver = None
    for line in listing.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 4 or not cells[0].isdigit():
            continue
        gpu: dict[str, Any] = {"index": int(cells[0]), "name": cells[1]}
        driver = cells[2] or driver
        if cells[3].isdigit():
            gpu["memory_mib"] = int(cells[3])
        if len(cells) > 4 and re.fullmatch(r"\d+\.\d+", cells[4]):
            major, minor = cells[4].split(".")
            gpu["arch"] = f"sm_{major}{minor}"
        found.append(gpu)
    out: dict[str, Any] = {"smi": "ok", "gpus": found}
    if driver:
        out["driver"] = driver
    header = _run([exe], timeout)
    m = _SMI_CUDA.search(header or "")
    if m:
        out["driver_cuda"] = m.group(1)
    return out


def requirement_pins(base: Path) -> dict[str, dict[str, str]]:
    """Pins of the packages above in the project's requirements files ({'peft': {'spec':
    '==0.3.0', 'file': 'requirements.txt'}}): what the code was written for."""
    out: dict[str, dict[str, str]] = {}
    wanted = {_norm(p) for p in PACKAGES}
    try:
        files = sorted(base.glob("requirements*.txt"))[:4]
    except OSError:
        return out
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")[:100_000]
        except OSError:
            continue
        for line in text.splitlines():
            m = _PIN.match(line.split("#", 1)[0])
            if m and _norm(m.group(1)) in wanted:
                out.setdefault(
                    _norm(m.group(1)), {"spec": m.group(2) + m.group(3), "file": path.name}
                )
    return out


def files(names: list[str] | tuple[str, ...], base: Path) -> dict[str, dict[str, Any]]:
    """Whether each file named exists here, and its size (relative names from `base`)."""
    out: dict[str, dict[str, Any]] = {}
    for name in list(dict.fromkeys(names))[:MAX_FILES]:
        path = Path(os.path.expanduser(name))
        if not path.is_absolute():
            path = base / path
        try:
            st = path.stat()
        except OSError:
            out[name] = {"path": str(path), "exists": False}
            continue
        out[name] = {"path": str(path), "exists": True, "bytes": st.st_size, "file": path.is_file()}
    return out


def read(
    named_files: list[str] | tuple[str, ...] = (),
    base: str | Path | None = None,
    smi: bool = True,
) -> dict[str, Any]:
    """Everything above for this machine, as plain data."""
    where = Path(base) if base is not None else Path.cwd()
    out: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": ".".join(str(v) for v in sys.version_info[:3]),
        "platform": {"win32": "windows", "darwin": "macos"}.get(sys.platform, sys.platform),
        **packages(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "requirements": requirement_pins(where),
        "files": files(named_files, where),
    }
    out.update(gpus() if smi else {"smi": "skipped", "gpus": []})
    return out
