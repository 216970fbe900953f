"""Saving and loading checkpoints: state_dict keys and shapes, devices, weights_only, files."""

from __future__ import annotations

from collections import Counter

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix, all_of, first, rx

# Keys of a training checkpoint dict, as opposed to a model's state_dict.
_WRAPPER_KEYS = (
    "state_dict",
    "model_state_dict",
    "model",
    "net",
    "module",
    "ema",
    "optimizer",
    "optimizer_state_dict",
    "scheduler",
    "lr_scheduler",
    "epoch",
    "step",
    "global_step",
    "args",
    "config",
    "best_acc",
    "best_acc1",
    "arch",
)
_STATE_KEYS = ("state_dict", "model_state_dict", "model", "net", "module", "ema")


def _keys(label: str, message: str) -> list[str]:
    m = rx(rf"{label} key\(s\) in state_dict:\s*((?:\"[^\"]*\",?\s*)+)").search(message)
    return [k.group(1) for k in all_of(r"\"([^\"]*)\"", m.group(1))] if m else []


def _prefix(longer: list[str], shorter: list[str]) -> str | None:
    """The prefix that turns keys of `shorter` into keys of `longer`, if one explains most."""
    short = set(shorter)
    found: Counter[str] = Counter()
    for key in longer:
        parts = key.split(".")
        for i in range(1, len(parts)):
            if ".".join(parts[i:]) in short:
                found[".".join(parts[:i]) + "."] += 1
                break
    if not found:
        return None
    prefix, count = found.most_common(1)[0]
    return prefix if count >= max(1, len(longer) // 2) else None


def _wrapper_prefix(keys: list[str], other: list[str]) -> str | None:
    """A wrapper's prefix (DDP's module., torch.compile's _orig_mod.) on every key of one side
    when the other side lists none to compare with."""
    if not keys or other:
        return None
    for prefix in ("module.", "_orig_mod."):
        if all(k.startswith(prefix) for k in keys):
            return prefix
    return None


def _keys_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    model = first(r"Error\(s\) in loading state_dict for (\w+)", message)
    if model:
        f["model_class"] = model
    missing, unexpected = _keys("Missing", message), _keys("Unexpected", message)
    for side, keys in (("missing", missing), ("unexpected", unexpected)):
        # torch <= 0.3 named one key: unexpected key "module.conv1.weight" in state_dict
        keys += [m.group(1) for m in all_of(rf"{side} key \"([^\"]+)\" in state_dict", message)]
    f["missing_count"], f["unexpected_count"] = len(missing), len(unexpected)
    if missing:
        f["missing_keys"] = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
    if unexpected:
        f["unexpected_keys"] = ", ".join(unexpected[:5]) + (" ..." if len(unexpected) > 5 else "")
    prefix = _prefix(unexpected, missing) or _wrapper_prefix(unexpected, missing)
    if prefix is not None:
        f["prefix"], f["prefix_side"] = prefix, "checkpoint"
    else:
        prefix = _prefix(missing, unexpected) or _wrapper_prefix(missing, unexpected)
        if prefix is not None:
            f["prefix"], f["prefix_side"] = prefix, "model"
    wrapper = [k for k in unexpected if k in _WRAPPER_KEYS]
    if wrapper and len(wrapper) * 2 >= len(unexpected):
        f["checkpoint_keys"] = ", ".join(wrapper)
        state = next((k for k in _STATE_KEYS if k in wrapper), None)
        if state:
            f["nested_key"] = state
    mismatched = [m.group(1) for m in all_of(r"size mismatch for (\S+):", message)]
    if mismatched:
        f["size_mismatch"] = ", ".join(mismatched[:5])
    return f


def _side(f: Fields, side: str, *prefixes: str) -> bool | None:
    """Whether the prefix found is on `side` and is one of `prefixes`; None without keys."""
    if not f.get("missing_count") and not f.get("unexpected_count"):
        return None
    return f.get("prefix_side") == side and any(p in f.get("prefix", "") for p in prefixes)


def _known(f: Fields, test: bool) -> bool | None:
    if not f.get("missing_count") and not f.get("unexpected_count"):
        return None
    return test


CKPT_KEYS = Entry(
    code="ckpt.keys",
    title="State dict keys do not match the model",
    meaning=(
        "load_state_dict (strict by default) found keys the model does not have (unexpected) "
        "or model keys the checkpoint lacks (missing). The usual reason is a prefix added by a "
        "wrapper: DistributedDataParallel and DataParallel add 'module.', torch.compile adds "
        "'_orig_mod.', training frameworks add their own; or the file is a training checkpoint "
        "whose model weights sit under one of its keys."
    ),
    patterns=(
        r"Missing key\(s\) in state_dict",
        r"Unexpected key\(s\) in state_dict",
        r"(?:unexpected|missing) keys? \"[^\"]+\" in state_dict",  # torch <= 0.3
    ),
    priority=5,
    examples=(
        "RuntimeError: Error(s) in loading state_dict for ResNet: Missing key(s) in "
        'state_dict: "conv1.weight", "bn1.weight", ... Unexpected key(s) in state_dict: '
        '"module.conv1.weight", "module.bn1.weight", ...',
        "RuntimeError: Error(s) in loading state_dict for GPT: Missing key(s) in state_dict: "
        '"wte.weight", ... Unexpected key(s) in state_dict: "_orig_mod.wte.weight", ...',
    ),
    summary=(
        "The checkpoint's keys start with '{{prefix}}' and the model's do not "
        "({{unexpected_count}} unexpected, {{missing_count}} missing), e.g. "
        "{{unexpected_keys}}.",
        "The checkpoint is a training checkpoint (keys {{checkpoint_keys}}), not a "
        "state_dict: the weights are under '{{nested_key}}'.",
        "The checkpoint is a training checkpoint (keys {{checkpoint_keys}}), not a state_dict.",
        "{{missing_count}} keys of {{model_class}} are missing from the checkpoint (e.g. "
        "{{missing_keys}}) and {{unexpected_count}} are unexpected (e.g. {{unexpected_keys}}).",
        "{{missing_count}} keys of {{model_class}} are missing from the checkpoint (e.g. "
        "{{missing_keys}}).",
        "{{unexpected_count}} keys of the checkpoint are unknown to {{model_class}} (e.g. "
        "{{unexpected_keys}}).",
        "The checkpoint's keys do not match the model's.",
    ),
    extract=_keys_fields,
    causes=(
        Cause(
            "ddp_checkpoint",
            "The checkpoint was saved from a DistributedDataParallel/DataParallel model (its "
            "keys start with 'module.') and is loaded into a plain model.",
            weight=0,
            when=lambda f: _side(f, "checkpoint", "module."),
            boost=12,
            only_when=True,
        ),
        Cause(
            "compiled_checkpoint",
            "The checkpoint was saved from a torch.compile'd model (its keys start with "
            "'_orig_mod.'); save the original module's state_dict instead.",
            weight=0,
            when=lambda f: _side(f, "checkpoint", "_orig_mod."),
            boost=13,
            only_when=True,
        ),
        Cause(
            "wrapped_model",
            "The model being loaded into is wrapped (DDP or torch.compile) but the "
            "checkpoint was saved from the plain model.",
            evidence="The model being loaded into is wrapped (its keys start with "
            "'{{prefix}}': DDP or torch.compile) but the checkpoint was saved from the plain "
            "model.",
            weight=0,
            when=lambda f: _known(f, f.get("prefix_side") == "model"),
            boost=12,
            only_when=True,
        ),
        Cause(
            "other_prefix",
            "The checkpoint's keys carry a prefix from the code that saved it (a training "
            "framework's wrapper module, a backbone inside a larger model).",
            evidence="The checkpoint's keys carry a '{{prefix}}' prefix from the code that "
            "saved it (a training framework's wrapper module, a backbone inside a larger "
            "model).",
            weight=0,
            when=lambda f: _known(
                f,
                f.get("prefix_side") == "checkpoint"
                and not _side(f, "checkpoint", "module.", "_orig_mod."),
            ),
            boost=11,
            only_when=True,
        ),
        Cause(
            "nested",
            (
                "The file is a training checkpoint; the model's weights are its "
                "'{{nested_key}}' entry.",
                "The file is a training checkpoint (model, optimizer, epoch, ...); pass its "
                "model entry to load_state_dict.",
            ),
            weight=0,
            when=lambda f: _known(f, "checkpoint_keys" in f),
            boost=14,
            only_when=True,
        ),
        Cause(
            "architecture",
            "The model definition differs from the one that was saved: renamed or added "
            "layers, another configuration, or another model class.",
            weight=2,
        ),
        Cause(
            "partial",
            "A partial load is intended (a new head for fine-tuning); use strict=False and "
            "check what was skipped.",
            weight=0.5,
        ),
    ),
    first_steps=(
        "Compare a few keys of each side: list(state)[:5] against list(model.state_dict())[:5].",
        "Save unwrapped state dicts: model.module.state_dict() under DDP, "
        "model._orig_mod.state_dict() for a compiled model.",
    ),
    fixes=(
        Fix(
            ("Strip the '{{prefix}}' prefix", "Strip the wrapper's prefix"),
            (
                'state = {k.removeprefix("{{prefix}}"): v for k, v in state.items()}\n'
                "model.load_state_dict(state)",
                'state = {k.removeprefix("module."): v for k, v in state.items()}\n'
                "model.load_state_dict(state)",
            ),
            ("ddp_checkpoint", "compiled_checkpoint", "other_prefix"),
        ),
        Fix(
            "Load into the wrapped module itself",
            "model.module.load_state_dict(state)       # DDP / DataParallel\n"
            "model._orig_mod.load_state_dict(state)    # torch.compile",
            ("wrapped_model",),
        ),
        Fix(
            "Save without the wrapper next time",
            'raw = model.module if hasattr(model, "module") else model\n'
            'raw = getattr(raw, "_orig_mod", raw)\n'
            'torch.save(raw.state_dict(), "model.pt")',
            ("ddp_checkpoint", "compiled_checkpoint", "wrapped_model"),
        ),
        Fix(
            ("Load the '{{nested_key}}' entry", "Load the model entry of the checkpoint"),
            (
                'ckpt = torch.load(path, map_location="cpu", weights_only=True)\n'
                'model.load_state_dict(ckpt["{{nested_key}}"])',
                'ckpt = torch.load(path, map_location="cpu", weights_only=True)\n'
                'model.load_state_dict(ckpt["model"])  # see ckpt.keys()',
            ),
            ("nested",),
        ),
        Fix(
            "Partial load, checked",
            "result = model.load_state_dict(state, strict=False)\n"
            "print(result.missing_keys, result.unexpected_keys)",
            ("partial", "architecture"),
        ),
    ),
)


def _shape_fields(message: str, text: str) -> Fields:
    found = all_of(
        r"size mismatch for (\S+): copying a param with shape (torch\.Size\(\[[\d, ]*\]\)) from "
        r"checkpoint, the shape in current model is (torch\.Size\(\[[\d, ]*\]\))",
        message,
    )
    if not found:
        return {}
    m = found[0]
    f: Fields = {"param": m.group(1), "checkpoint_shape": m.group(2), "model_shape": m.group(3)}
    f["mismatch_count"] = len(found)
    f["params"] = ", ".join(x.group(1) for x in found[:5])
    return f


_HEAD = r"(?:^|\.)(?:fc|head|heads|classifier|lm_head|logits|out_proj|output|cls)\b"
_EMBED = r"embed|wte|tok|vocab|word_embeddings"

CKPT_SHAPE = Entry(
    code="ckpt.shape",
    title="State dict tensor shapes do not match the model",
    meaning=(
        "A parameter exists in both the checkpoint and the model but with different shapes: "
        "the model was built with another configuration (number of classes, vocabulary size, "
        "hidden size) than the one that was saved."
    ),
    patterns=(r"size mismatch for \S+: copying a param with shape",),
    examples=(
        "RuntimeError: Error(s) in loading state_dict for ResNet: size mismatch for fc.weight: "
        "copying a param with shape torch.Size([1000, 2048]) from checkpoint, the shape in "
        "current model is torch.Size([10, 2048]).",
    ),
    summary=(
        "{{param}} is {{checkpoint_shape}} in the checkpoint but {{model_shape}} in the model "
        "({{mismatch_count}} mismatched: {{params}}).",
        "Tensors of the checkpoint and the model differ in shape.",
    ),
    extract=_shape_fields,
    causes=(
        Cause(
            "head",
            (
                "The classification head differs ({{param}}): the checkpoint was trained for "
                "another number of classes. For fine-tuning, load everything except the head.",
            ),
            weight=1,
            when=lambda f: bool(rx(_HEAD).search(f["params"])),
            boost=12,
            only_when=True,
        ),
        Cause(
            "vocab",
            "The vocabulary size differs ({{param}}): tokens were added or another tokenizer "
            "is used.",
            weight=0.5,
            when=lambda f: bool(rx(_EMBED).search(f["params"])),
            boost=12,
            only_when=True,
        ),
        Cause(
            "config",
            "The model was built with another configuration (width, depth, patch size) than "
            "the checkpoint.",
            weight=2,
        ),
    ),
    first_steps=(
        "Print both shapes for every mismatched key and compare the model configuration with "
        "the one stored next to the checkpoint.",
    ),
    fixes=(
        Fix(
            "Load all but the mismatched tensors",
            "own = model.state_dict()\n"
            "state = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}\n"
            "print(model.load_state_dict(state, strict=False))",
            ("head", "vocab"),
        ),
        Fix(
            "Build the model as it was saved, then replace the head",
            "model = resnet50(num_classes=1000)\nmodel.load_state_dict(state)\n"
            "model.fc = nn.Linear(model.fc.in_features, num_classes)",
            ("head", "config"),
        ),
    ),
)

CUDA_DESERIALIZE = Entry(
    code="ckpt.cuda_deserialize",
    title="Checkpoint saved on a GPU that is not available here",
    meaning=(
        "torch.save records the device of every tensor; torch.load puts them back on the same "
        "device unless told otherwise. Here that device does not exist: no CUDA at all, or "
        "fewer GPUs than on the machine that saved the file."
    ),
    patterns=(
        r"Attempting to deserialize object on (?:a )?CUDA device",
        r"Attempting to deserialize object on CUDA device \d+ but torch\.cuda\.device_count",
    ),
    priority=5,
    examples=(
        "RuntimeError: Attempting to deserialize object on a CUDA device but "
        "torch.cuda.is_available() is False. If you are running on a CPU-only machine, please "
        "use torch.load with map_location=torch.device('cpu') to map your storages to the CPU.",
        "RuntimeError: Attempting to deserialize object on CUDA device 3 but "
        "torch.cuda.device_count() is 1. Please use torch.load with map_location to map your "
        "storages to an existing device.",
    ),
    summary=(
        "The checkpoint holds tensors of CUDA device {{device}}, but this process sees "
        "{{device_count}} GPU(s).",
        "The checkpoint holds CUDA tensors but CUDA is not available here.",
    ),
    extract=lambda message, text: {
        k: int(v)
        for k, v in (
            ("device", first(r"on CUDA device (\d+)", message)),
            ("device_count", first(r"device_count\(\) is (\d+)", message)),
        )
        if v is not None
    },
    causes=(
        Cause(
            "cpu_machine",
            "Loading on a machine (or in a process) without CUDA a file saved from GPU tensors.",
            weight=2,
            signals=(r"is_available\(\) is False",),
        ),
        Cause(
            "fewer_gpus",
            "The file was saved from a GPU index this process does not have (fewer GPUs "
            "visible: CUDA_VISIBLE_DEVICES, another node).",
            evidence="The file was saved from GPU {{device}} and this process has only "
            "{{device_count}} (CUDA_VISIBLE_DEVICES, another node).",
            weight=1,
            when=lambda f: "device_count" in f,
            boost=12,
        ),
        Cause(
            "cpu_build",
            "The machine has a GPU but this PyTorch cannot use it: a CPU-only build (its "
            "version ends in +cpu) or a driver too old for the build's CUDA.",
            evidence="The machine has a GPU ({{gpu_names}}) but this PyTorch ({{torch_version}}) "
            "cannot use it: a CPU-only build, or a driver too old for its CUDA.",
            weight=1.5,
            when=lambda f: (
                (str(f.get("torch_version", "")).endswith("+cpu") or bool(f.get("gpu_names")))
                or None
            ),
            boost=12,
        ),
    ),
    first_steps=(
        "Always pass map_location to torch.load for files from another machine.",
        'On a machine with a GPU: `python -c "import torch; print(torch.__version__, '
        'torch.version.cuda, torch.cuda.is_available())"` and `nvidia-smi`.',
    ),
    fixes=(
        Fix(
            "Load to the CPU, then move the model",
            'state = torch.load(path, map_location="cpu", weights_only=True)\n'
            "model.load_state_dict(state)\nmodel.to(device)",
            ("cpu_machine", "fewer_gpus"),
        ),
        Fix(
            "Load to this rank's GPU",
            'state = torch.load(path, map_location=f"cuda:{local_rank}", weights_only=True)',
            ("fewer_gpus",),
        ),
        Fix(
            "Install the CUDA build of PyTorch on a machine with a GPU",
            "pip install torch --index-url https://download.pytorch.org/whl/cu126\n"
            'python -c "import torch; print(torch.version.cuda, torch.cuda.is_available())"',
            ("cpu_build",),
            needs=("gpu_names", "torch_version"),
            check="Check first that the machine has a GPU (`nvidia-smi`) and that torch is a "
            "CPU build (`torch.version.cuda` is None).",
        ),
    ),
)


def _weights_only_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    name = first(r"Unsupported global: GLOBAL ([\w.]+)", message) or first(
        r"Unsupported global: GLOBAL ([\w.]+)", text
    )
    if name:
        f["global_name"] = name
        module, _, cls = name.rpartition(".")
        f["global_module"], f["global_class"] = module, cls
        if module.startswith("numpy.") and module.endswith("multiarray"):
            # what else the load meets after this global: an array's class, or a scalar's
            # dtype and its class (numpy 2 names the module numpy._core, 1 numpy.core)
            here = "np" + module[len("numpy") :]
            wanted = [f"{here}.{cls}", "np.ndarray"] if cls == "_reconstruct" else [f"{here}.{cls}"]
            f["numpy_globals"] = ", ".join([*wanted, "np.dtype", "type(np.dtype(np.float64))"])
    operand = first(r"Unsupported operand (\d+)", message)
    if operand:
        f["operand"] = int(operand)
    return f


WEIGHTS_ONLY = Entry(
    code="ckpt.weights_only",
    title="weights_only load refused the file",
    meaning=(
        "torch.load(weights_only=True) only unpickles tensors, primitive types and "
        "allow-listed classes, so a checkpoint cannot run arbitrary code. PyTorch 2.6 made "
        "weights_only=True the default, and files that pickle other objects (argparse "
        "Namespace, NumPy scalars, custom classes, whole models) now fail to load."
    ),
    patterns=(
        r"Weights only load failed",
        r"WeightsUnpickler error",
        r"Unsupported global: GLOBAL",
    ),
    priority=2,
    examples=(
        "_pickle.UnpicklingError: Weights only load failed. ... WeightsUnpickler error: "
        "Unsupported global: GLOBAL argparse.Namespace was not an allowed global by default. "
        "Please use `torch.serialization.add_safe_globals([Namespace])` ...",
        "_pickle.UnpicklingError: Weights only load failed. Re-running `torch.load` with "
        "`weights_only` set to `False` will likely succeed, but it can result in arbitrary code "
        "execution. ... WeightsUnpickler error: Unsupported operand 149",
    ),
    summary=(
        "The file pickles a {{global_name}} object, which weights_only=True does not allow.",
        "The file holds an object that weights_only=True cannot unpickle (operand {{operand}}).",
        "The file holds objects that weights_only=True does not allow.",
    ),
    extract=_weights_only_fields,
    causes=(
        Cause(
            "pickled_object",
            (
                "Besides tensors the checkpoint stores a {{global_name}} object (saved "
                "arguments, a config object, a NumPy value).",
                "Besides tensors the checkpoint stores other Python objects (saved arguments, "
                "a config object, NumPy values).",
            ),
            weight=2,
        ),
        Cause(
            "whole_model",
            "The file holds a whole pickled nn.Module (torch.save(model)) rather than a "
            "state_dict.",
            weight=0.5,
            signals=(r"GLOBAL [\w.]*(?:Module|Net|Model|Sequential)\b|torch\.nn\.modules",),
            boost=12,
        ),
        Cause(
            "numpy",
            "NumPy objects (a metric saved as np.float64, an array) inside the checkpoint: "
            "allow-listing the one global named is not enough, the next load stops at "
            "numpy.dtype and then at the dtype's class.",
            weight=0.3,
            signals=(r"GLOBAL numpy",),
            boost=12,
        ),
        Cause(
            "untrusted",
            "If the file does not come from a source you trust, keep weights_only=True: a "
            "pickle can run any code when loaded.",
            weight=0.1,
        ),
    ),
    first_steps=(
        "Decide whether you trust the file. If you do not, only allow-list specific classes "
        "you know.",
    ),
    fixes=(
        Fix(
            "A file you trust: load it with weights_only=False (or allow-list all NumPy needs)",
            (
                'state = torch.load(path, map_location="cpu", weights_only=False)  # trusted only\n'
                "# or, keeping weights_only=True, every global this NumPy value needs:\n"
                "torch.serialization.add_safe_globals(\n"
                "    [{{numpy_globals}}])",
                'state = torch.load(path, map_location="cpu", weights_only=False)  # trusted only\n'
                "# or, keeping weights_only=True, every global a NumPy scalar needs:\n"
                "torch.serialization.add_safe_globals(\n"
                "    [np.core.multiarray.scalar, np.dtype, type(np.dtype(np.float64))])",
            ),
            ("numpy",),
        ),
        Fix(
            ("Allow-list {{global_name}}", "Allow-list the class"),
            (
                "import {{global_module}}\n"
                "torch.serialization.add_safe_globals([{{global_name}}])\n"
                'state = torch.load(path, map_location="cpu", weights_only=True)',
                "torch.serialization.add_safe_globals([MyConfig])\n"
                'state = torch.load(path, map_location="cpu", weights_only=True)',
            ),
            ("pickled_object",),
        ),
        Fix(
            "Re-save a clean checkpoint once (from a trusted file)",
            'ckpt = torch.load(path, map_location="cpu", weights_only=False)  # trusted only\n'
            'torch.save({"model": ckpt["model"], "args": vars(ckpt["args"])}, "clean.pt")',
            ("pickled_object", "whole_model", "numpy"),
        ),
        Fix(
            "Save only tensors and plain Python values",
            'torch.save({"model": model.state_dict(), "epoch": epoch, "args": vars(args),\n'
            '            "best": float(best)}, "ckpt.pt")',
            ("pickled_object", "whole_model", "numpy"),
        ),
    ),
)

CORRUPT = Entry(
    code="ckpt.corrupt",
    title="Checkpoint file is corrupt or not a checkpoint",
    meaning=(
        "The file is not a complete PyTorch checkpoint: it was cut short while being written "
        "or copied, or it is something else (a Git LFS pointer, an HTML error page, another "
        "format)."
    ),
    patterns=(
        r"PytorchStreamReader failed reading zip archive",
        r"failed finding central directory",
        r"invalid header or archive is corrupted",
        r"unexpected EOF, expected \d+ more bytes",
        r"invalid load key, '.'",
        r"pickle data was truncated",
    ),
    # Also what a spawned child reads when its parent died (Windows multiprocessing): without
    # a loader in the traceback, a likely category only. torch >= 2.6's weights_only loader
    # raises a bare EOFError on an empty file.
    keys=(r"EOFError: Ran out of input", r"^EOFError\s*$"),
    confirm=(
        r"torch[/\\]serialization\.py|\btorch\.load\(|pickle\.load\(|_legacy_load"
        r"|_weights_only_unpickler",
    ),
    examples=(
        "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central "
        "directory",
        "_pickle.UnpicklingError: invalid load key, 'v'.",
        "EOFError: Ran out of input",
    ),
    summary=(
        "The file starts with '{{load_key}}', which is not how a PyTorch checkpoint starts.",
        "The checkpoint file is incomplete or not a PyTorch checkpoint.",
    ),
    extract=lambda message, text: (
        {"load_key": k} if (k := first(r"invalid load key, '(.)'", message)) else {}
    ),
    causes=(
        Cause(
            "lfs",
            "The file is a Git LFS pointer (a small text file starting with 'version "
            "https://git-lfs...'): run `git lfs pull`.",
            weight=0,
            when=lambda f: f["load_key"] == "v",
            boost=12,
            only_when=True,
        ),
        Cause(
            "html",
            "The download saved an HTML page (an error or a login page) instead of the file.",
            weight=0,
            when=lambda f: f["load_key"] == "<",
            boost=12,
            only_when=True,
        ),
        Cause(
            "truncated",
            "Saving or copying stopped early: the job was killed while writing, the disk "
            "filled up, or a transfer did not finish.",
            evidence="{{empty_file}} is empty (0 bytes): the save never wrote it (killed, disk "
            "full) or the download failed.",
            when=lambda f: "empty_file" in f or None,
            weight=2,
        ),
        Cause(
            "format",
            "The file is in another format (safetensors, NumPy, a TorchScript archive).",
            weight=0.5,
        ),
    ),
    first_steps=(
        "Check the file's size and first bytes: `ls -l ckpt.pt; head -c 100 ckpt.pt | xxd`.",
    ),
    fixes=(
        Fix(
            "Fetch the real file, or write it again",
            "git lfs pull   # a Git LFS pointer: fetch the file itself\n"
            "# otherwise download it again, or save it again from the run that made it",
            ("lfs", "html", "truncated"),
        ),
        Fix(
            "Write checkpoints atomically",
            'torch.save(state, path + ".tmp")\nos.replace(path + ".tmp", path)',
            ("truncated",),
        ),
        Fix(
            "Use the loader of the format",
            "from safetensors.torch import load_file\nstate = load_file(path)",
            ("format",),
        ),
    ),
)

ENTRIES = (CKPT_KEYS, CKPT_SHAPE, CUDA_DESERIALIZE, WEIGHTS_ONLY, CORRUPT)
