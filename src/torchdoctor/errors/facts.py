"""The facts an error text states besides its message: the devices and dtypes it names, the
platform its paths belong to, the versions and GPUs it mentions, the libraries in its frames.

The catalog's causes read them (with the message's own fields) to decide which cause is likely
for *this* text: two GPUs named, so not "the model is still on the CPU"; bf16 against fp16, so
not "float64 data". Pure text, no torch; every reader is linear in the text.
"""

from __future__ import annotations

import re
from typing import Any

from torchdoctor.errors import edges

Facts = dict[str, Any]

# Facts are read from a longer log's two ends (errors/edges.py): every pattern below is a scan
# of the text, and 40,000 lines took 3 CPU-s scanned whole.

_DEVICE = re.compile(r"\b(cuda:\d+|cpu|mps|xpu:\d+|xpu|meta)\b(?![\w.])")
_DEVICE_TYPE = re.compile(r"device(?: type)? (cuda|cpu|mps)\b", re.IGNORECASE)
# dtype spellings, from messages ("c10::Half", "torch.bfloat16", "Half", "float") to one name.
_DTYPE_NAMES = {
    "half": "float16",
    "float16": "float16",
    "c10::half": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "c10::bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float": "float32",
    "float32": "float32",
    "fp32": "float32",
    "double": "float64",
    "float64": "float64",
    "long": "int64",
    "int64": "int64",
    "int": "int32",
    "int32": "int32",
    "byte": "uint8",
    "uint8": "uint8",
    "bool": "bool",
}
_DTYPE = re.compile(
    r"(?<![\w.])(?:torch\.|c10::|struct c10::)?"
    r"(Half|BFloat16|Float16|Float32|Float64|Float|Double|Long|Int64|Int32|Byte|UInt8|Bool"
    r"|half|bfloat16|float16|float32|float64|double|bf16|fp16|fp32)(?![\w])"
)
_DTYPE_CONTEXT = re.compile(
    r"dtype|scalar type|same dtype|!=|but got|but found|expected|Tensor\b|type \(", re.IGNORECASE
)
_WINDOWS_PATH = re.compile(r"\b[A-Z]:\\|\\site-packages\\|python\.exe|\\AppData\\")
_MAC_PATH = re.compile(r"/Users/\w|/opt/homebrew/|darwin|macOS|MacBook|\bM[1-4] (?:Pro|Max)\b")
_LINUX_PATH = re.compile(r"/home/|/usr/(?:local/)?lib/python|/opt/conda/|/root/|dist-packages")
_TORCH_VERSION = re.compile(
    r"(?:\btorch(?:==|\s+|:\s*|\s*version:?\s*)|PyTorch(?: version)?:?\s+)"
    r"v?(\d+\.\d+(?:\.\d+)?(?:\.dev\d+)?(?:\+(?:cu|rocm|cpu)[\w.]*)?)",
    re.IGNORECASE,
)
_CUDA_BUILD = re.compile(r"\+cu(\d{3})\b|/whl/(?:nightly/)?cu(\d{3})\b|\bcu(\d{3})torch")
_CPU_BUILD = re.compile(r"\d\+cpu\b|/whl/cpu\b")
_GPU_NAME = re.compile(
    r"\b(?:NVIDIA\s+|GeForce\s+)*((?:RTX|GTX)\s*\d{3,4}(?:\s*Ti)?D?|RTX\s+PRO\s+\d{4}"
    r"|[AHBL]\d{2,3}(?:-\w+)?|V100|P100|T4|K80|Tesla \w+|Quadro \w+|MI\d{3}\w?)\b"
)
_SM = re.compile(r"\bsm_(\d{2,3})\b")
_DRIVER = re.compile(r"Driver Version:\s*([\d.]+)|found version (\d{4,5})")
_PACKAGES = {
    "peft": re.compile(r"\bpeft\b|lora_[AB]\b|LoraConfig|get_peft_model"),
    "transformers": re.compile(r"\btransformers[/\\.]|\btransformers\b=="),
    "accelerate": re.compile(r"\baccelerate[/\\.]|accelerate launch"),
    "deepspeed": re.compile(r"\bdeepspeed\b", re.IGNORECASE),
    "lightning": re.compile(r"pytorch_lightning|lightning[/\\.]"),
    "flash_attn": re.compile(r"flash_attn|flash-attn"),
    "unsloth": re.compile(r"\bunsloth"),
    "comfyui": re.compile(r"ComfyUI|comfy[/\\]"),
    "torchvision": re.compile(r"\btorchvision\b"),
    "triton": re.compile(r"\btriton\b"),
    "vllm": re.compile(r"\bvllm\b|VllmWorker"),
}
_MENTIONS = {
    "data_parallel": re.compile(r"\bDataParallel\b|data_parallel\.py|parallel_apply\.py|dp_accel"),
    "ddp": re.compile(r"DistributedDataParallel|distributed\.py\", line|\bDDP\b"),
    "fsdp": re.compile(r"\bFSDP\b|fully_sharded_data_parallel|_flat_param\.py"),
    "checkpointing": re.compile(
        r"utils/checkpoint\.py|utils\\checkpoint\.py|gradient[_ ]checkpointing|use_reentrant"
        r"|CheckpointFunction",
        re.IGNORECASE,
    ),
    "docker": re.compile(r"\bdocker\b|/workspace/|container", re.IGNORECASE),
    "notebook": re.compile(r"ipython-input|Cell In\s*\[|\bcolab\b|ipykernel", re.IGNORECASE),
    "dataloader_worker": re.compile(r"DataLoader worker|_worker_loop|worker\.py"),
    "autocast": re.compile(r"\bautocast\b|GradScaler|grad_scaler\.py|mixed_precision"),
    "embedding": re.compile(r"\bembedding\b|Embedding\b|embedding_renorm|get_input_embeddings"),
    "torchrun": re.compile(r"torchrun|torch\.distributed\.(?:launch|run|elastic)"),
    "windows": _WINDOWS_PATH,
}
_CHECKPOINT_FILE = re.compile(
    r"""(?:(?<=['"(\s=])|^)((?:[A-Za-z]:)?[\w./\\~-]*\.(?:pth|pt|ckpt|bin|safetensors|pth\.tar))"""
    r"""(?=['")\s,:]|$)""",
    re.MULTILINE,
)


def _dtypes(text: str) -> list[str]:
    found: dict[str, None] = {}
    for line in text.splitlines():
        if not _DTYPE_CONTEXT.search(line):
            continue
        for m in _DTYPE.finditer(line):
            name = _DTYPE_NAMES.get(m.group(1).lower())
            if name is not None:
                found[name] = None
    return list(found)


def _platform(text: str) -> str | None:
    if _WINDOWS_PATH.search(text):
        return "windows"
    if _MAC_PATH.search(text):
        return "macos"
    if _LINUX_PATH.search(text):
        return "linux"
    return None


def read(text: str) -> Facts:
    """The facts of `text`; keys are absent where the text says nothing."""
    text = edges.of_text(text)
    f: Facts = {}
    devices = {m.group(1) for m in _DEVICE.finditer(text)} | {
        m.group(1).lower() for m in _DEVICE_TYPE.finditer(text)
    }
    devices.discard("meta")
    if devices:
        f["devices"] = sorted(devices)
        cudas = sorted(d for d in devices if d.startswith("cuda:"))
        if cudas:
            f["gpus_named"] = cudas
    dtypes = _dtypes(text)
    if dtypes:
        f["dtypes"] = dtypes
    platform = _platform(text)
    if platform:
        f["platform"] = platform
    m = _TORCH_VERSION.search(text)
    if m:
        f["torch_version"] = m.group(1)
    m = _CUDA_BUILD.search(text)
    if m:
        digits = next(g for g in m.groups() if g)
        f["cuda_build"] = f"cu{digits}"
    elif _CPU_BUILD.search(text):
        f["cuda_build"] = "cpu"
    gpus = {" ".join(m.group(1).split()) for m in _GPU_NAME.finditer(text)}
    if gpus:
        f["gpu_names"] = sorted(gpus)
    m = _SM.search(text)
    if m:
        f["gpu_arch"] = f"sm_{m.group(1)}"
    m = _DRIVER.search(text)
    if m:
        f["driver"] = m.group(1) or m.group(2)
    packages = [name for name, pattern in _PACKAGES.items() if pattern.search(text)]
    if packages:
        f["packages"] = packages
    mentions = [name for name, pattern in _MENTIONS.items() if pattern.search(text)]
    if mentions:
        f["mentions"] = mentions
    files = list(dict.fromkeys(m.group(1) for m in _CHECKPOINT_FILE.finditer(text)))
    files = [p for p in files if not p.endswith((".py", "/"))]
    if files:
        f["checkpoint_files"] = files[:8]
    return f


def mentions(f: Facts, *names: str) -> bool:
    have = set(f.get("mentions", ())) | set(f.get("packages", ()))
    return any(name in have for name in names)


def has_dtype(f: Facts, *names: str) -> bool:
    have = set(f.get("dtypes", ()))
    return any(name in have for name in names)


def several_gpus(f: Facts) -> bool:
    return len(f.get("gpus_named", ())) >= 2


def blackwell(f: Facts) -> bool:
    """A GPU of the RTX 50 series or sm_120/sm_100: supported by CUDA 12.8 builds only."""
    if f.get("gpu_arch") in ("sm_120", "sm_100", "sm_101"):
        return True
    return any(re.match(r"RTX\s*50\d0|B\d{3}\b|RTX PRO 6000", g) for g in f.get("gpu_names", ()))
