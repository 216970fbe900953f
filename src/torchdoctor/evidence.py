"""`torchdoctor explain --here`: the error explained with this machine as evidence.

`gather` reads the machine (torchdoctor.machine: versions and builds, GPUs and driver, the
project's pins, the files the text names) and summarises each checkpoint the text names with
`ckpt`'s reader (its format, the state dict's key prefixes, a wrapper's prefix, the model
family its keys look like, the globals it pickles), without running its code or loading its
tensors. `explain_here` hands all that to the catalog (errors.here rules causes in or out).
`from_run_dir` reads the error a run directory recorded, and says whether it ran on this host.
"""

from __future__ import annotations

import collections
import json
import re
import socket
from pathlib import Path
from typing import Any

from torchdoctor import machine
from torchdoctor.checkpoint import reader, summary
from torchdoctor.errors import facts
from torchdoctor.errors.api import Explanation, exception_text, explain_exception, explain_text
from torchdoctor.store import rundir

MAX_CHECKPOINT_BYTES = 64 * 2**30  # only the pickle is read; the tensors are not
# Key patterns of model families, most specific first: what a state dict's keys look like.
FAMILIES = (
    (r"(?:^|\.)lora_[AB]\.", "LoRA adapter (PEFT): adapter weights only, not a whole model"),
    (r"(?:^|\.)model\.diffusion_model\.", "Stable Diffusion checkpoint (LDM UNet)"),
    (r"(?:^|\.)down_blocks\.\d+\.(?:resnets|attentions)\.", "diffusers UNet/VAE"),
    (
        r"(?:^|\.)layers\.\d+\.self_attn\.[qkvo]_proj\.",
        "Llama-style decoder (Llama, Mistral, Qwen)",
    ),
    (r"(?:^|\.)h\.\d+\.attn\.c_attn\.", "GPT-2"),
    (r"(?:^|\.)gpt_neox\.layers\.\d+\.", "GPT-NeoX"),
    (r"(?:^|\.)layer\.\d+\.attention\.self\.query\.", "BERT-style encoder"),
    (r"(?:^|\.)(?:vision_model|text_model)\.encoder\.", "CLIP"),
    (r"(?:^|\.)encoder\.layers\.encoder_layer_\d+\.", "ViT (torchvision)"),
    (r"(?:^|\.)blocks\.\d+\.attn\.qkv\.", "ViT (timm)"),
    (r"(?:^|\.)layer[1-4]\.\d+\.conv[1-3]\.weight$", "ResNet"),
    (r"(?:^|\.)features\.\d+\.", "CNN with a 'features' trunk (VGG, DenseNet, MobileNet)"),
    (r"(?:^|\.)backbone\.", "model with a 'backbone' (a detector or segmenter)"),
)
_SAFE_GLOBAL = re.compile(r"^(?:torch|collections|builtins|_codecs)\.")


def family(keys: list[str]) -> str | None:
    """The model family a state dict's keys look like, when one pattern covers some keys."""
    for pattern, name in FAMILIES:
        rx = re.compile(pattern)
        if any(rx.search(k) for k in keys):
            return name
    return None


def checkpoint(path: str | Path) -> dict[str, Any]:
    """What `ckpt`'s reader finds in the file, as the facts explain uses."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_CHECKPOINT_BYTES:
            return {}
        ck = reader.read(p)
    except reader.CheckpointError as exc:
        return {"error": str(exc)}
    except (OSError, ValueError, EOFError, MemoryError) as exc:
        return {"error": f"unreadable: {exc}"}
    except Exception as exc:  # a reader bug must not cost the explanation
        return {"error": f"unreadable: {type(exc).__name__}"}
    out: dict[str, Any] = {"format": ck.format}
    sds = summary.state_dicts(ck)
    out["tensors"] = sum(len(sd.tensors) for sd in sds)
    if sds:
        sd = sds[0]
        keys = list(sd.tensors)
        out["state_dict"] = sd.path or "(root)"
        wrapper = next(
            (w for w in ("module.", "_orig_mod.") if keys and all(k.startswith(w) for k in keys)),
            None,
        )
        if wrapper:
            out["wrapper"] = wrapper
        bare = [k[len(wrapper) :] if wrapper else k for k in keys]
        tops = collections.Counter(k.split(".", 1)[0] for k in bare)
        out["prefixes"] = [name for name, _n in tops.most_common(5)]
        found = family(bare)
        if found:
            out["family"] = found
            out["adapter"] = found.startswith("LoRA")
    odd = [g for g in ck.globals if not _SAFE_GLOBAL.match(g)]
    if odd:
        out["needs_globals"] = sorted(set(odd))[:8]
    return out


def gather(
    text: str, base: str | Path | None = None, smi: bool = True, files: list[str] | None = None
) -> dict[str, Any]:
    """This machine's facts for an error text: machine.read for the files the text names (and
    `files`), with each existing, non-empty one summarised as a checkpoint."""
    named = list(facts.read(text).get("checkpoint_files", ())) + list(files or ())
    found = machine.read(named, base=base, smi=smi)
    checkpoints = {}
    for name, info in found["files"].items():
        if info.get("exists") and info.get("file") and info.get("bytes"):
            summarised = checkpoint(info["path"])
            if summarised:
                checkpoints[name] = summarised
    found["checkpoints"] = checkpoints
    return found


def explain_here(
    error: str | BaseException, base: str | Path | None = None, smi: bool = True
) -> Explanation:
    """The error (a text, or an exception caught in this process) explained with this machine
    as evidence."""
    if isinstance(error, BaseException):
        text = exception_text(error)
        found = gather(text, base=base, smi=smi, files=loaded_files(error))
        return explain_exception(error, found)
    return explain_text(error, machine=gather(error, base=base, smi=smi))


# Loaders whose frames hold the path of the file they read: torch.load(f), safetensors.
_LOADERS = re.compile(r"torch[/\\]serialization\.py$|safetensors[/\\]\w+\.py$")


def loaded_files(exc: BaseException) -> list[str]:
    """The files the loaders in an exception's traceback were reading (the `f` of torch.load),
    which a bare EOFError does not name."""
    out: list[str] = []
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if _LOADERS.search(frame.f_code.co_filename):
            for name in ("f", "filename", "path"):
                value = frame.f_locals.get(name)
                if isinstance(value, (str, Path)) and str(value) not in out:
                    out.append(str(value))
        tb = tb.tb_next
    return out[:4]


def from_run_dir(run_dir: str | Path) -> tuple[str, dict[str, Any]]:
    """The error a run directory recorded (the crash or out-of-memory diagnosis, and the
    stacks of a fatal signal) and its meta.json; `meta['here']` says whether it ran on this
    host. The text is empty when the run recorded no error."""
    path = Path(run_dir)
    meta = rundir.read_meta(path)
    parts: list[str] = []
    try:
        lines = (path / rundir.DIAGNOSES_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        evidence = record.get("evidence") if isinstance(record, dict) else None
        if record.get("kind") not in ("crash", "oom") or not isinstance(evidence, dict):
            continue
        message = str(evidence.get("message") or "")
        exception = evidence.get("exception")
        if exception and not message.startswith(f"{exception}:"):
            message = f"{exception}: {message}"
        if message.strip():
            parts.append(message)
            break
    try:
        fatal = (path / rundir.FATAL_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        fatal = ""
    if fatal.strip():
        parts.append(fatal[-20_000:])
    meta = dict(meta)
    meta["here"] = meta.get("host") in (None, socket.gethostname())
    return "\n".join(parts), meta
