"""The machine as evidence: facts read where the error happened (installed versions and builds,
the GPUs and driver, the files the error names, the project's pins; torchdoctor.machine reads
them, torchdoctor.evidence adds what the named checkpoints hold) rule a category's causes in or
out, and each finding says which facts it used.

Pure: plain data in, findings out; no torch, no I/O.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from torchdoctor.errors import facts

Machine = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Finding:
    """One fact of this machine and what it means for the error. `rule_in`/`rule_out` name
    causes of the entry; `confirms` makes a category read from key nouns alone certain (the
    checkpoint torch.load read is 0 bytes)."""

    said: str
    rule_in: tuple[str, ...] = ()
    rule_out: tuple[str, ...] = ()
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    confirms: bool = False


def _vt(version: Any) -> tuple[int, ...]:
    if not version:
        return ()
    out = []
    for part in re.split(r"[.+]", str(version).split("+")[0]):
        m = re.match(r"\d+", part)
        if m is None:
            break
        out.append(int(m.group()))
    return tuple(out)


def _build_cuda(build: str | None) -> tuple[int, ...]:
    """'cu124' or 'cuda 12.4' -> (12, 4); anything else -> ()."""
    if not build:
        return ()
    m = re.fullmatch(r"cu(\d+)(\d)", build)
    if m:
        return (int(m.group(1)), int(m.group(2)))
    m = re.fullmatch(r"cuda (\d+)\.(\d+)", build)
    return (int(m.group(1)), int(m.group(2))) if m else ()


def context(machine: Machine) -> dict[str, Any]:
    """The machine's facts under the names the text's facts use (torch_version, cuda_build,
    gpu_names, gpu_arch, driver), for the causes' conditions; plus driver_cuda, gpu_count."""
    out: dict[str, Any] = {}
    versions = machine.get("versions") or {}
    if versions.get("torch"):
        out["torch_version"] = versions["torch"]
    build = (machine.get("builds") or {}).get("torch")
    if build == "cpu":
        out["cuda_build"] = "cpu"
    elif build and build.startswith("cuda "):
        major, _, minor = build[5:].partition(".")
        out["cuda_build"] = f"cu{major}{minor}"
    gpus = machine.get("gpus") or []
    if gpus:
        out["gpu_names"] = sorted({g["name"] for g in gpus})
        arch = next((g["arch"] for g in gpus if g.get("arch")), None)
        if arch:
            out["gpu_arch"] = arch
    if machine.get("smi") == "ok":
        out["gpu_count"] = len(gpus)
    for name in ("driver", "driver_cuda"):
        if machine.get(name):
            out[name] = machine[name]
    return out


def driver_too_old(f: Mapping[str, Any]) -> bool | None:
    """The driver supports an older CUDA than the one torch was built with; None: unknown."""
    driver, build = _vt(f.get("driver_cuda")), _build_cuda(f.get("cuda_build"))
    if not driver or not build:
        return None
    return driver[:2] < build[:2]


def _describe(ctx: Mapping[str, Any], machine: Machine) -> str | None:
    """'torch 2.5.1+cu124 (CUDA 12.4 build), driver 550.54 (up to CUDA 12.4), 2 GPUs: ...'."""
    parts = []
    if ctx.get("torch_version"):
        build = ctx.get("cuda_build")
        cuda = _build_cuda(build)
        kind = (
            f"a CUDA {cuda[0]}.{cuda[1]} build"
            if cuda
            else "a CPU-only build"
            if build == "cpu"
            else ""
        )
        parts.append(f"torch {ctx['torch_version']}" + (f" ({kind})" if kind else ""))
    smi = machine.get("smi")
    if smi == "ok":
        if ctx.get("driver"):
            upto = f" (up to CUDA {ctx['driver_cuda']})" if ctx.get("driver_cuda") else ""
            parts.append(f"NVIDIA driver {ctx['driver']}{upto}")
        gpus = machine.get("gpus") or []
        if gpus:
            names = ", ".join(
                f"{g['name']}" + (f" ({g['arch']})" if g.get("arch") else "") for g in gpus[:4]
            )
            parts.append(f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''}: {names}")
        else:
            parts.append("no NVIDIA GPU listed by nvidia-smi")
    elif smi == "absent":
        parts.append("no nvidia-smi (no NVIDIA driver installed)")
    return "Here: " + "; ".join(parts) + "." if parts else None


Rule = Callable[[Machine, dict[str, Any], str], list[Finding]]


def _torch_companions(machine: Machine, ctx: dict[str, Any], text: str) -> list[Finding]:
    out = []
    versions = machine.get("versions") or {}
    torch = versions.get("torch")
    builds = machine.get("builds") or {}
    for name, built in (machine.get("built_for_torch") or {}).items():
        if name not in versions or (name not in text and name != "torchvision"):
            continue
        if torch is None:
            out.append(
                Finding(
                    f"{name} {versions[name]} is installed but torch is not.",
                    rule_in=("torchvision_pair",),
                )
            )
            continue
        want = _vt(built["torch"])
        have = _vt(torch)[: len(want)]
        how = "its metadata" if built["from"] == "metadata" else "its release number"
        if want != have:
            out.append(
                Finding(
                    f"{name} {versions[name]} here was built for torch {built['torch']} ({how} "
                    f"says so), but torch {torch} is installed: the pair does not fit.",
                    rule_in=("torchvision_pair",),
                    fields={"companion": name, "companion_torch": built["torch"]},
                )
            )
            continue
        mine, theirs = builds.get("torch"), builds.get(name)
        if mine and theirs and mine != theirs:
            out.append(
                Finding(
                    f"{name} {versions[name]} is a {theirs} build and torch {torch} a {mine} "
                    "build: built for different CUDA versions.",
                    rule_in=("torchvision_pair",),
                )
            )
            continue
        out.append(
            Finding(
                f"{name} {versions[name]} was built for torch {built['torch']} ({how}), the one "
                "installed: the pair fits.",
                rule_out=("torchvision_pair",),
            )
        )
    return out


_NUMPY_ABI = re.compile(
    r"compiled using NumPy 1\.x|_ARRAY_API not found|numpy\.dtype size changed|"
    r"numpy\.core\.multiarray failed to import|module compiled against ABI version",
    re.IGNORECASE,
)


def _numpy(machine: Machine, ctx: dict[str, Any], text: str) -> list[Finding]:
    version = (machine.get("versions") or {}).get("numpy")
    if not version or not _NUMPY_ABI.search(text):
        return []
    if _vt(version)[:1] >= (2,):
        return [
            Finding(
                f"NumPy {version} is installed here: modules compiled against NumPy 1.x do not "
                "import with it.",
                rule_in=("numpy_abi",),
            )
        ]
    return [
        Finding(
            f"NumPy {version} is installed here (1.x): the module was built against another "
            "NumPy than this one.",
            rule_in=("numpy_abi",),
        )
    ]


def _extensions(machine: Machine, ctx: dict[str, Any], text: str) -> list[Finding]:
    if not re.search(r"undefined symbol|DLL load failed|cannot open shared object", text):
        return []
    versions = machine.get("versions") or {}
    named = [n for n in ("flash-attn", "xformers", "bitsandbytes", "deepspeed") if n in versions]
    if not named or not versions.get("torch"):
        return []
    listed = ", ".join(f"{n} {versions[n]}" for n in named)
    return [
        Finding(
            f"Installed here: torch {versions['torch']} with {listed}: an extension built "
            "for another torch release names symbols this torch lacks.",
            rule_in=("extension_abi",),
        )
    ]


def _gpu_build(machine: Machine, ctx: dict[str, Any], text: str) -> list[Finding]:
    """The build against the GPU and the driver (no kernel image, cuBLAS/cuDNN failures)."""
    out = []
    build = _build_cuda(ctx.get("cuda_build"))
    too_old = driver_too_old(ctx)
    if too_old:
        out.append(
            Finding(
                f"The driver here ({ctx.get('driver', '?')}) supports up to CUDA "
                f"{ctx['driver_cuda']}, older than the CUDA {build[0]}.{build[1]} this torch "
                "was built for.",
                rule_in=("driver", "versions"),
            )
        )
    elif too_old is False:
        out.append(
            Finding(
                f"The driver here supports CUDA {ctx['driver_cuda']}, enough for this torch's "
                f"CUDA {build[0]}.{build[1]}.",
                rule_out=("driver",),
            )
        )
    arch = ctx.get("gpu_arch")
    if arch and build:
        if facts.blackwell(ctx) and build < (12, 8):
            out.append(
                Finding(
                    f"The GPU here is {arch}, which only CUDA 12.8+ builds support; this torch "
                    f"is a CUDA {build[0]}.{build[1]} build.",
                    rule_in=("wheel", "versions"),
                )
            )
        elif facts.blackwell(ctx):
            out.append(
                Finding(
                    f"The GPU here is {arch} and this torch is a CUDA {build[0]}.{build[1]} "
                    "build, which includes it.",
                    rule_out=("wheel",),
                )
            )
        elif int(arch[3:]) < 50:
            out.append(
                Finding(
                    f"The GPU here is {arch}, older than current PyTorch builds support.",
                    rule_in=("wheel", "versions"),
                )
            )
    return out


def _no_cuda(machine: Machine, ctx: dict[str, Any], text: str) -> list[Finding]:
    """CUDA not available / a CUDA checkpoint on a machine without it / NCCL missing."""
    out = []
    build = ctx.get("cuda_build")
    gpus = machine.get("gpus") or []
    if build == "cpu":
        with_gpus = f" while nvidia-smi lists {len(gpus)} GPU(s)" if gpus else ""
        out.append(
            Finding(
                f"torch {ctx.get('torch_version', '')} here is a CPU-only build{with_gpus}.",
                rule_in=("cpu_build",),
            )
        )
    elif build:
        out.append(
            Finding(
                f"torch {ctx.get('torch_version', '')} here is a CUDA build.",
                rule_out=("cpu_build",),
            )
        )
    if machine.get("smi") == "absent":
        out.append(
            Finding(
                "nvidia-smi is not installed here: no NVIDIA driver, so no GPU to use.",
                rule_in=("driver", "cpu_machine", "no_gpu"),
            )
        )
    elif machine.get("smi") == "ok" and not gpus:
        out.append(
            Finding(
                "nvidia-smi lists no GPU here.", rule_in=("visibility", "cpu_machine", "no_gpu")
            )
        )
    elif gpus:
        out.append(
            Finding(
                f"This machine has {len(gpus)} GPU(s).",
                rule_out=("cpu_machine", "no_gpu"),
            )
        )
    visible = machine.get("cuda_visible_devices")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        out.append(
            Finding(
                f"CUDA_VISIBLE_DEVICES={visible!r} here hides every GPU.",
                rule_in=("visibility",),
            )
        )
    too_old = driver_too_old(ctx)
    if too_old:
        out.append(
            Finding(
                f"The driver here supports up to CUDA {ctx['driver_cuda']}, older than this "
                "torch's build.",
                rule_in=("driver",),
            )
        )
    return out


def _device_count(machine: Machine, ctx: dict[str, Any], text: str) -> list[Finding]:
    if machine.get("smi") != "ok":
        return []
    n = len(machine.get("gpus") or [])
    visible = machine.get("cuda_visible_devices")
    said = f"This machine has {n} GPU(s)" + (f" (indices 0 to {n - 1})" if n else "")
    if visible:
        said += f"; CUDA_VISIBLE_DEVICES={visible} renumbers the visible ones from 0"
    return [
        Finding(
            said + ".",
            rule_in=("visible",) if visible else ("hardcoded", "fewer_gpus"),
            fields={"gpu_count": n},
        )
    ]


def _platform(machine: Machine, ctx: dict[str, Any], text: str) -> list[Finding]:
    if machine.get("platform") == "windows":
        return [
            Finding("This machine runs Windows: PyTorch has no NCCL there.", rule_in=("platform",))
        ]
    if machine.get("platform") == "macos":
        return [
            Finding("This machine runs macOS: PyTorch has no NCCL there.", rule_in=("platform",))
        ]
    return []


def _triton(machine: Machine, ctx: dict[str, Any], text: str) -> list[Finding]:
    if not re.search(r"triton", text, re.IGNORECASE):
        return []
    versions = machine.get("versions") or {}
    out = []
    if "triton" in versions:
        out.append(
            Finding(f"triton {versions['triton']} is installed here.", rule_out=("triton_missing",))
        )
    else:
        names = ("triton_missing",)
        out.append(Finding("triton is not installed here.", rule_in=names))
    arch = ctx.get("gpu_arch")
    if arch and int(arch[3:]) < 70:
        out.append(
            Finding(
                f"The GPU here is {arch}: Triton (inductor's GPU code) needs compute "
                "capability 7.0 or newer.",
                rule_in=("triton",),
            )
        )
    return out


def _checkpoint_files(machine: Machine, ctx: dict[str, Any], text: str) -> list[Finding]:
    """The files the text names: missing here, empty, or what they hold."""
    out = []
    checkpoints = machine.get("checkpoints") or {}
    for name, info in (machine.get("files") or {}).items():
        if not info.get("exists"):
            out.append(Finding(f"{name} is not at {info.get('path', name)} here."))
            continue
        size = info.get("bytes")
        if size == 0:
            out.append(
                Finding(
                    f"{name} here is 0 bytes: the save or the download never wrote it.",
                    rule_in=("truncated",),
                    rule_out=("lfs", "html", "format"),
                    fields={"empty_file": name},
                    confirms=True,
                )
            )
            continue
        ck = checkpoints.get(name) or {}
        problem = ck.get("error")
        if problem:
            rule = (
                ("lfs",)
                if "LFS" in problem
                else ("html",)
                if "HTML" in problem
                else ("format",)
                if "not a PyTorch checkpoint" in problem or "NumPy" in problem
                else ("truncated",)
            )
            out.append(
                Finding(f"{name} here ({size:,} bytes): {problem}.", rule_in=rule, confirms=True)
            )
            continue
        if not ck:
            out.append(Finding(f"{name} here: {size:,} bytes."))
            continue
        out += _checkpoint_content(name, size, ck)
    return out


def _checkpoint_content(name: str, size: int, ck: Mapping[str, Any]) -> list[Finding]:
    parts = [f"{name} here: {size:,} bytes, {ck.get('format', '?')} format"]
    if ck.get("tensors") is not None:
        parts.append(f"{ck['tensors']} tensors")
    where = ck.get("state_dict")
    if where:
        parts.append(f"the weights under '{where}'")
    family = ck.get("family")
    if family:
        parts.append(f"keys of a {family}")
    prefixes = ck.get("prefixes") or []
    if prefixes:
        parts.append("top-level keys " + ", ".join(f"'{p}'" for p in prefixes[:5]))
    rule_in: tuple[str, ...] = ()
    wrapper = ck.get("wrapper")
    if wrapper == "module.":
        parts.append("every key starts with 'module.' (saved from DDP/DataParallel)")
        rule_in = ("ddp_checkpoint",)
    elif wrapper == "_orig_mod.":
        parts.append("every key starts with '_orig_mod.' (saved from a compiled model)")
        rule_in = ("compiled_checkpoint",)
    if where and where != "(root)":
        rule_in += ("nested",)
    if ck.get("adapter"):
        rule_in += ("architecture",)
    globals_ = ck.get("needs_globals") or []
    if globals_:
        parts.append("it pickles " + ", ".join(globals_[:4]))
        if any(g.startswith("numpy") for g in globals_):
            rule_in += ("numpy",)
    return [Finding("; ".join(parts) + ".", rule_in=rule_in)]


def _pins(machine: Machine, ctx: dict[str, Any], text: str) -> list[Finding]:
    """The project's requirements pin versions other than the ones installed here."""
    out = []
    versions = {k.lower(): v for k, v in (machine.get("versions") or {}).items()}
    for name, pin in (machine.get("requirements") or {}).items():
        have = versions.get(name)
        spec = pin["spec"]
        m = re.match(r"(==|~=|>=|<=|<|>)(.+)", spec)
        if have is None or m is None:
            continue
        op, want = m.group(1), _vt(m.group(2).rstrip(".*"))
        got = _vt(have)
        fits = {
            "==": got[: len(want)] == want,
            "~=": got[: max(1, len(want) - 1)] == want[: max(1, len(want) - 1)] and got >= want,
            ">=": got >= want,
            "<=": got[: len(want)] <= want,
            "<": got < want,
            ">": got > want,
        }[op]
        relevant = name in _STACK or re.search(rf"\b{re.escape(name)}\b", text, re.I)
        if not fits and relevant:
            out.append(
                Finding(
                    f"{pin['file']} pins {name}{spec}; {name} {have} is installed here.",
                    rule_in=("library_version", "versions"),
                    fields={"pinned": f"{name}{spec}", "installed": f"{name} {have}"},
                )
            )
    return out


# Libraries that wrap the model or build its kernels: a pin of theirs that the installed
# version breaks is a likely cause whatever the text names.
_STACK = ("torch", "torchvision", "triton", "transformers", "peft", "accelerate", "deepspeed")


def _weights_default(machine: Machine, ctx: dict[str, Any], text: str) -> list[Finding]:
    torch = (machine.get("versions") or {}).get("torch")
    if not torch or _vt(torch)[:2] < (2, 6):
        return []
    return [
        Finding(
            f"torch {torch} here loads with weights_only=True by default (since 2.6): a file "
            "that loaded with an older torch can fail now."
        )
    ]


_FILES_FIRST = (_checkpoint_files,)
# Which rules speak to which category (by code, or by family with a trailing '.').
RULES: dict[str, tuple[Rule, ...]] = {
    "install.mismatch": (_torch_companions, _numpy, _extensions),
    "cuda.no_kernel_image": (_gpu_build,),
    "cublas.error": (_gpu_build,),
    "cudnn.error": (_gpu_build,),
    "cuda.not_available": (_no_cuda,),
    "ckpt.cuda_deserialize": (_no_cuda, _device_count),
    "cuda.invalid_device": (_device_count,),
    "dist.backend_unavailable": (_platform, _no_cuda),
    "compile.backend_failed": (_triton,),
    "ckpt.corrupt": _FILES_FIRST,
    "ckpt.keys": _FILES_FIRST,
    "ckpt.shape": _FILES_FIRST,
    "ckpt.weights_only": (_weights_default, _checkpoint_files),
}
# Families (and categories) whose causes include the installed stack: the versions line first.
DESCRIBED = (
    "cuda",
    "install",
    "compile",
    "distributed",
    "launcher",
    "parallel",
    "ckpt.cuda_deserialize",
    "ckpt.weights_only",
)


def findings(
    code: str, family: str, machine: Machine, ctx: dict[str, Any], text: str
) -> list[Finding]:
    """What this machine says about an error of category `code` (whose text is `text`)."""
    out: list[Finding] = []
    if family in DESCRIBED or code in DESCRIBED:
        described = _describe(ctx, machine)
        if described:
            out.append(Finding(described))
    for rule in RULES.get(code, ()):
        out += rule(machine, ctx, text)
    if code not in RULES or _checkpoint_files not in RULES[code]:
        # A file the text names that is empty here is worth saying whatever the category.
        out += [f for f in _checkpoint_files(machine, ctx, text) if f.fields.get("empty_file")]
    out += _pins(machine, ctx, text)
    return out


__all__ = ["Finding", "context", "driver_too_old", "findings"]
