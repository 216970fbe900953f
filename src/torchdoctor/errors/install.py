"""Installs that do not fit together: compiled extensions built for another torch, torchvision
of another release, modules built against NumPy 1.x under NumPy 2."""

from __future__ import annotations

import re

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix, first

# Compiled extensions users meet, by the module name in the message -> the pip package.
_PACKAGES = (
    (r"flash_attn", "flash-attn"),
    (r"xformers", "xformers"),
    (r"bitsandbytes|libbitsandbytes", "bitsandbytes"),
    (r"torchvision", "torchvision"),
    (r"torchaudio", "torchaudio"),
    (r"mmcv", "mmcv"),
    (r"detectron2", "detectron2"),
    (r"pytorch3d", "pytorch3d"),
    (r"torch_scatter|torch_sparse|torch_cluster", "torch-scatter / torch-sparse"),
    (r"apex|amp_C|fused_layer_norm", "apex"),
    (r"deepspeed", "deepspeed"),
    (r"vllm", "vllm"),
    (r"dropout_layer_norm|rotary_emb|ft_attention", "flash-attn (its csrc extensions)"),
)
_SO = re.compile(r"([\w.-]+?)(?:\.cpython-[\w-]+)?\.(?:so|pyd|dll)(?:\.\d+)*\b")


def _fields(message: str, text: str) -> Fields:
    f: Fields = {}
    both = f"{message}\n{text}"
    if re.search(r"torchvision::\w+|torchvision", message):
        f["library"] = "torchvision"
    else:
        so = first(r"([\w./\\-]+\.(?:so|pyd|dll)(?:\.\d+)*)\b", message)
        if so:
            f["library"] = _SO.search(so.replace("\\", "/").rsplit("/", 1)[-1]).group(1)  # type: ignore[union-attr]
    library = f.get("library", "")
    for pattern, package in _PACKAGES:
        if re.search(pattern, library or message):
            f["package"] = package
            break
    op = first(r"(torchvision::\w+)", message)
    if op:
        f["operator"] = op
    symbol = first(r"undefined symbol:\s*(\S+)", message)
    if symbol:
        f["symbol"] = symbol
    numpy = first(r"cannot be run in\s+NumPy (\d+\.\d+(?:\.\d+)?)", both)
    if numpy:
        f["numpy"] = numpy
    if re.search(r"NumPy 1\.x|_ARRAY_API not found|numpy\.core\.multiarray failed", both):
        f["abi"] = "numpy"
    elif symbol or re.search(r"cannot open shared object|undefined symbol", message):
        f["abi"] = "torch"
    return f


MISMATCH = Entry(
    code="install.mismatch",
    title="Installed packages built for different versions",
    meaning=(
        "A compiled part of a package does not fit the library it was built against: an "
        "extension (flash-attn, xformers, a CUDA op) built for another torch, C++ ABI or CUDA, "
        "a torchvision of another release than torch (its C++ operators then fail to "
        "register), or a module compiled against NumPy 1.x imported under NumPy 2. The code is "
        "fine; the installation mixes versions."
    ),
    patterns=(
        r"operator torchvision::\w+ does not exist",
        r"No such operator torchvision::\w+",
        r"Could not run 'torchvision::\w+' with arguments from the '\w+' backend",
        r"compiled with different CUDA (?:major )?versions",
        r"\.(?:so|pyd)(?:\.\d+)*: undefined symbol",
        r"^(?:\w+Error: )?undefined symbol: _Z",
        r"lib(?:torch|c10)\w*\.so(?:\.\d+)*: cannot open shared object file",
        r"A module that was compiled using NumPy 1\.x cannot be run in",
        r"_ARRAY_API not found",
        r"numpy\.core\.multiarray failed to import",
        r"Error loading \"[^\"]*torch[\\/]lib[\\/]\w+\.dll\"",
    ),
    keys=(r"undefined symbol", r"torchvision::", r"NumPy 2\.\d"),
    priority=2,
    examples=(
        "RuntimeError: operator torchvision::nms does not exist",
        "ImportError: /opt/lib/python3.12/site-packages/flash_attn_2_cuda.cpython-312-x86_64-"
        "linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
        "A module that was compiled using NumPy 1.x cannot be run in\nNumPy 2.1.2 as it may crash.",
    ),
    summary=(
        "{{operator}} is missing: torchvision does not fit the installed torch.",
        "{{library}} was built for another torch than the one installed ({{symbol}} is missing).",
        "A module built against NumPy 1.x runs under NumPy {{numpy}}.",
        "{{library}} does not fit the installed torch.",
        "Installed packages were built for different versions of each other.",
    ),
    extract=_fields,
    causes=(
        Cause(
            "torchvision_pair",
            "torchvision does not match torch: each torchvision release is built for one torch "
            "release (and CUDA build), and upgrading torch alone, or installing a package that "
            "pins another torch, leaves the old torchvision behind.",
            weight=1,
            when=lambda f: f.get("library") == "torchvision" or None,
            boost=20,
        ),
        Cause(
            "extension_abi",
            "A compiled extension was built against another torch (or CUDA, or C++ ABI flag) "
            "than the one installed: reinstalling or upgrading torch leaves it behind, and a "
            "prebuilt wheel must match torch, CUDA, Python and cxx11abi exactly.",
            weight=1,
            when=lambda f: (f.get("abi") == "torch" and f.get("library") != "torchvision") or None,
            boost=20,
        ),
        Cause(
            "numpy_abi",
            "A module compiled against NumPy 1.x is imported with NumPy 2.x installed "
            "(an old torch, opencv, pandas or a custom extension).",
            weight=1,
            when=lambda f: f.get("abi") == "numpy" or None,
            boost=20,
        ),
        Cause(
            "two_environments",
            "Two Python environments are mixed: the package was installed by a pip that "
            "belongs to another Python (ComfyUI's embedded Python, a conda env, ~/.local).",
            weight=0.3,
            signals=(r"python_embeded|\.local/lib/python|AppData\\Roaming\\Python",),
            boost=2,
        ),
    ),
    first_steps=(
        'Print what is installed: python -c "import torch, torchvision; '
        'print(torch.__version__, torch.version.cuda, torchvision.__version__)"',
        "`pip list | grep -i -E 'torch|numpy|flash|xformers'` in the environment that runs "
        "the program (python -m pip, not a pip from another environment).",
    ),
    fixes=(
        Fix(
            "Install torch and torchvision together, from one index",
            "pip uninstall -y torch torchvision torchaudio\n"
            "pip install torch torchvision torchaudio --index-url "
            "https://download.pytorch.org/whl/cu126\n"
            "# pip then picks the torchvision built for that torch",
            ("torchvision_pair",),
        ),
        Fix(
            (
                "Reinstall {{package}} for the installed torch",
                "Reinstall the extension for the installed torch",
            ),
            "pip uninstall -y flash-attn  # the package of the failing .so\n"
            "pip install flash-attn --no-build-isolation --no-cache-dir  # rebuilt from source\n"
            "# or the prebuilt wheel whose name matches torch, CUDA, Python and cxx11abi",
            ("extension_abi",),
        ),
        Fix(
            "Keep NumPy below 2 for modules built against 1.x (or upgrade those modules)",
            'pip install "numpy<2"',
            ("numpy_abi",),
        ),
        Fix(
            "Install with the pip of the Python that runs the program",
            "python -m pip install --force-reinstall <package>",
            ("two_environments",),
        ),
    ),
)

ENTRIES = (MISMATCH,)
