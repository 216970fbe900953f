"""Out of memory: on the GPU (CUDA/ROCm), on the host, on Apple's MPS."""

from __future__ import annotations

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix
from torchdoctor.errors.oom_message import (
    CPU_PATTERNS,
    GPU_PATTERNS,
    MPS_PATTERNS,
    cpu_fields,
    gpu_fields,
    mps_fields,
)


def _share(fields: Fields, name: str, of: str, at_least: float) -> bool:
    return bool(fields[f"{name}_bytes"] >= at_least * fields[f"{of}_bytes"])


def _fragmented(f: Fields) -> bool:
    spare = f["reserved_minus_allocated_bytes"]
    return bool(spare >= f["asked_bytes"] and spare >= 0.05 * f.get("total_bytes", 0))


def _huge(f: Fields) -> bool:
    return _share(f, "asked", "total", 0.25)


def _shared(f: Fields) -> bool:
    """Other processes named, or much more held outside PyTorch's cache than the CUDA
    context and the libraries' workspaces take (up to about 1.5 GiB)."""
    if f.get("process_count", 0) > 1:
        return True
    return _share(f, "outside_pytorch", "total", 0.3) and f["outside_pytorch_bytes"] >= 1.5 * 2**30


_EVAL_FRAMES = (
    r", in (?:_?eval\w*|validat\w*|_?test\w*|predict\w*|infer\w*|generate\w*|sample\w*)\b"
)
_PROGRESS = r"\b(?:step|iter(?:ation)?|epoch)\s*[:=#]?\s*(?:[2-9]|[1-9]\d+)\b|\b[1-9]\d+/\d+ \["

OOM_CUDA = Entry(
    code="oom.cuda",
    title="CUDA out of memory",
    meaning=(
        "The GPU had no free block as large as the tensor being created. PyTorch's caching "
        "allocator keeps memory it has used ('reserved') for reuse; 'allocated' is what live "
        "tensors occupy, so reserved minus allocated is cached but idle, and memory outside "
        "reserved belongs to the CUDA context, other libraries or other processes. The "
        "question to answer is what holds the memory."
    ),
    patterns=GPU_PATTERNS,
    examples=(
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.35 GiB total "
        "capacity; 76.28 GiB already allocated; 1.45 GiB free; 77.50 GiB reserved in total by "
        "PyTorch)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
        "total capacity of 79.15 GiB of which 12.75 MiB is free. ... Of the allocated memory "
        "77.63 GiB is allocated by PyTorch, and 1.01 GiB is reserved by PyTorch but unallocated.",
        "RuntimeError: CUDA error: out of memory",
    ),
    summary=(
        "Tried to allocate {{asked}} on GPU {{gpu}} with {{free}} free of {{total}}; PyTorch "
        "held {{allocated}} in tensors and {{reserved}} reserved ({{reserved_minus_allocated}} "
        "cached but unused).",
        "Tried to allocate {{asked}} with {{free}} free of {{total}}; PyTorch held "
        "{{allocated}} in tensors and {{reserved}} reserved.",
        "Tried to allocate {{asked}} on GPU {{gpu}} with {{free}} free of {{total}}; PyTorch "
        "held {{allocated}} in tensors.",
        "Tried to allocate {{asked}} on GPU {{gpu}}, which did not have that much free.",
        "Tried to allocate {{asked}}, more than the GPU had free.",
        "The GPU ran out of memory outside PyTorch's allocator (CUDA context, cuBLAS, NCCL).",
    ),
    extract=gpu_fields,
    exceptions=("OutOfMemoryError",),
    causes=(
        Cause(
            "batch",
            "The batch and the activations kept for backward do not fit: batch size, sequence "
            "length or image resolution is too large for this GPU.",
            weight=5,
            signals=(r"\.backward\(|run_backward|, in forward\b",),
            boost=2,
        ),
        Cause(
            "huge",
            "A single tensor is too big (an attention matrix over a long sequence, logits "
            "over a large vocabulary, a whole dataset moved to the GPU at once).",
            evidence="A single allocation of {{asked}} is a large share of the GPU's "
            "{{total}}: one tensor is too big (an attention matrix over a long sequence, "
            "logits over a large vocabulary, a whole dataset moved to the GPU at once).",
            weight=1,
            when=_huge,
            boost=10,
        ),
        Cause(
            "fragmentation",
            "The allocator's cache is fragmented: reserved memory is well above allocated "
            "memory, but no free block is large enough.",
            evidence="{{reserved_minus_allocated}} is reserved by PyTorch but unallocated, at "
            "least as much as the {{asked}} asked for: the cache is fragmented and no free "
            "block is large enough.",
            weight=1.5,
            when=_fragmented,
            boost=10,
        ),
        Cause(
            "leak",
            "Memory grows step after step: tensors that keep their autograd graph are held "
            "across iterations (losses.append(loss), total += loss, outputs kept in a list), "
            "or one unusually large batch arrives late in the epoch.",
            weight=3,
            signals=(_PROGRESS,),
            boost=4,
        ),
        Cause(
            "eval",
            "Evaluation runs without torch.no_grad() or torch.inference_mode(), so every "
            "forward pass stores activations for a backward pass that never comes.",
            weight=2,
            signals=(_EVAL_FRAMES, r"model\.eval\(\)"),
        ),
        Cause(
            "optimizer",
            "The optimizer allocates its state at the first optimizer.step(): Adam keeps two "
            "extra tensors per parameter, twice the size of the model.",
            weight=1,
            signals=(r"optimizer\.step\(|_multi_tensor_adam|_single_tensor_adam|_init_group",),
        ),
        Cause(
            "model",
            "The model itself (parameters, gradients and optimizer state) is too large for "
            "one GPU.",
            weight=1.5,
            signals=(r", in _apply\b|\.cuda\(\)|\.to\(device\)|, in convert\b",),
        ),
        Cause(
            "shared",
            "Another process uses the same GPU, or every rank created its CUDA context on "
            "GPU 0 (no torch.cuda.set_device(local_rank)).",
            evidence=(
                "{{outside_pytorch}} of the GPU is held outside PyTorch's cache: other "
                "processes on the same GPU ({{processes}}), a leftover job, or the CUDA "
                "context and NCCL buffers.",
                "{{outside_pytorch}} of the GPU is held outside PyTorch's cache: another "
                "process on the same GPU, a leftover job, or the CUDA context and NCCL buffers.",
            ),
            weight=1.2,
            when=_shared,
            signals=(r"CUDA error: out of memory",),
            boost=11,
        ),
        Cause(
            "loading",
            "A checkpoint is loaded straight onto the GPU (torch.load without map_location) "
            "next to a model that is already there.",
            weight=0.3,
            signals=(r"torch\.load\(|load_state_dict|serialization\.py",),
        ),
        Cause(
            "attention",
            "Attention materialises a sequence-by-sequence score matrix per head, so memory "
            "grows with the square of the sequence length.",
            weight=0.4,
            signals=(r"attention|scaled_dot_product|baddbmm|\bbmm\b|, in _attn\b",),
        ),
    ),
    first_steps=(
        "Note when it fails: at the first step it is a sizing problem (batch, sequence length, "
        "model); after many steps it is a leak or one unusually large batch.",
        "Measure memory after each phase (model load, forward, backward, optimizer.step) with "
        "torch.cuda.memory_allocated() and torch.cuda.max_memory_allocated(), or run under "
        "`torchdoctor run train.py` and query the allocated/max_allocated/reserved columns of "
        "python.steps.",
        "Record a snapshot of the allocator (torch.cuda.memory._record_memory_history(), then "
        "torch.cuda.memory._dump_snapshot('oom.pickle')) and open it at "
        "https://pytorch.org/memory_viz to see which tensors hold the memory.",
        "Check `nvidia-smi` for other processes on the same GPU.",
    ),
    fixes=(
        Fix(
            "Smaller micro-batches with gradient accumulation (same effective batch)",
            "accum = 4  # micro-batch = batch_size // accum\n"
            "for i, (x, y) in enumerate(loader):\n"
            "    loss = criterion(model(x), y) / accum\n"
            "    loss.backward()\n"
            "    if (i + 1) % accum == 0:\n"
            "        optimizer.step()\n"
            "        optimizer.zero_grad(set_to_none=True)",
            ("batch", "huge"),
        ),
        Fix(
            "Keep numbers, not graphs, across steps",
            "losses.append(loss.item())   # not losses.append(loss)\n"
            "running_loss += loss.item()  # not running_loss += loss",
            ("leak",),
        ),
        Fix(
            "Evaluate without building a graph",
            "model.eval()\n"
            "with torch.inference_mode():\n"
            "    for x, y in val_loader:\n"
            "        out = model(x.to(device))",
            ("eval",),
        ),
        Fix(
            "Let the allocator grow segments instead of fragmenting",
            "# before the first CUDA allocation (or export it in the shell)\n"
            'os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"',
            ("fragmentation",),
        ),
        Fix(
            "Mixed precision: bf16 autocast halves activation memory",
            'with torch.autocast("cuda", dtype=torch.bfloat16):\n    loss = criterion(model(x), y)',
            ("batch", "attention", "model"),
        ),
        Fix(
            "Activation checkpointing: recompute in backward instead of storing",
            "from torch.utils.checkpoint import checkpoint\n"
            "for block in self.blocks:\n"
            "    h = checkpoint(block, h, use_reentrant=False)",
            ("batch", "attention", "model"),
        ),
        Fix(
            "Fused attention that never materialises the score matrix",
            "out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)",
            ("attention", "huge"),
        ),
        Fix(
            "Load checkpoints to the CPU first",
            'state = torch.load(path, map_location="cpu", weights_only=True)\n'
            "model.load_state_dict(state)",
            ("loading",),
        ),
        Fix(
            "Shard parameters, gradients and optimizer state across GPUs (FSDP)",
            "from torch.distributed.fsdp import fully_shard  # PyTorch >= 2.6\n"
            "for block in model.blocks:\n"
            "    fully_shard(block)\n"
            "fully_shard(model)",
            ("model", "optimizer"),
        ),
        Fix(
            "Find who else holds the GPU",
            "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv\n"
            "# and in DDP, pin each process to its own GPU first:\n"
            "torch.cuda.set_device(local_rank)",
            ("shared",),
        ),
    ),
)


OOM_CPU = Entry(
    code="oom.cpu",
    title="Host (CPU) out of memory",
    meaning=(
        "The process ran out of host RAM: an allocation on the CPU failed, or the kernel's "
        "OOM killer ended the process with SIGKILL (exit code 137, or -9 in torchrun's "
        "report), which leaves no Python traceback at all."
    ),
    patterns=(*CPU_PATTERNS,),
    examples=(
        "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not "
        "enough memory: you tried to allocate 17179869184 bytes.",
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 7.45 GiB for an array "
        "with shape (1000000, 1000) and data type float64",
        "[Tue Mar  4 10:02:11 2025] Out of memory: Killed process 4242 (python) "
        "total-vm:98765432kB",
    ),
    summary=(
        "Tried to allocate {{asked}} of host memory for an array of shape {{array_shape}}.",
        "Tried to allocate {{asked}} of host memory, more than was available.",
        "The process was killed with SIGKILL, most likely by the kernel's OOM killer: host "
        "RAM ran out.",
        "The process ran out of host memory.",
    ),
    extract=cpu_fields,
    exceptions=("MemoryError", "_ArrayMemoryError"),
    causes=(
        Cause(
            "oom_killer",
            "Host RAM ran out and the kernel's OOM killer ended the process (SIGKILL, exit "
            "code 137 or -9); `dmesg` shows 'Out of memory: Killed process'.",
            weight=1,
            when=lambda f: f.get("signal") == "SIGKILL",
            signals=(r"(?-i:^Killed\b)|Out of memory: Kill|OOMKilled",),
        ),
        Cause(
            "big_tensor",
            (
                "A tensor of {{asked}} was requested on the CPU: an oversized batch, a huge "
                "intermediate (an N-by-N distance matrix, all predictions of a dataset), or a "
                "model running on the CPU by mistake.",
                "A very large tensor was created on the CPU: an oversized batch, a huge "
                "intermediate, or a model running on the CPU by mistake.",
            ),
            weight=2,
            when=lambda f: "asked" in f,
        ),
        Cause(
            "dataset",
            "The dataset (or a cache of it) is loaded into RAM, and again in every DataLoader "
            "worker.",
            weight=1.5,
            signals=(r"numpy|for an array|__getitem__|dataset",),
            boost=3,
        ),
        Cause(
            "workers",
            "Many DataLoader workers, each with its own copy of the Python objects (pages "
            "shared after fork are copied as reference counts change); large prefetch_factor.",
            weight=1,
            signals=(r"worker|Errno 12|fork",),
        ),
        Cause(
            "leak",
            "Host memory grows through the run: outputs, losses or Python objects collected "
            "in lists or caches across steps.",
            weight=1,
        ),
        Cause(
            "checkpoint",
            "A large checkpoint is materialised in RAM, once per rank on the node.",
            weight=0.5,
            signals=(r"torch\.load\(|load_state_dict|serialization",),
        ),
    ),
    first_steps=(
        "Check the kernel log: `dmesg -T | grep -i -E 'killed process|out of memory'` (or the "
        "job scheduler's memory report).",
        "Watch the resident memory of the training process and its workers while it runs "
        "(`top`, or the rss column of torchdoctor's python.steps table): steady growth means "
        "a leak, a jump at start-up means data loaded at once.",
        "Try num_workers=0: if the memory problem goes away, the workers' copies are the cost.",
    ),
    fixes=(
        Fix(
            "Read data lazily instead of loading it all",
            'array = np.load("features.npy", mmap_mode="r")  # pages in on demand\n'
            'state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)',
            ("dataset", "checkpoint"),
        ),
        Fix(
            "Fewer workers, smaller prefetch",
            "loader = DataLoader(ds, batch_size=64, num_workers=4, prefetch_factor=2,\n"
            "                    persistent_workers=True)",
            ("workers", "oom_killer"),
        ),
        Fix(
            "Keep numbers, not tensors, across steps",
            "history.append(loss.item())\npreds.append(out.argmax(1).cpu())  # not whole outputs",
            ("leak",),
        ),
        Fix(
            "Smaller batches, or work in chunks",
            "loader = DataLoader(ds, batch_size=16)   # a smaller batch\n"
            "for chunk in torch.split(x, 4096):       # or one big tensor in pieces\n"
            "    out.append(f(chunk))",
            ("big_tensor",),
        ),
    ),
)


OOM_MPS = Entry(
    code="oom.mps",
    title="MPS (Apple GPU) out of memory",
    meaning=(
        "The Metal backend reached its memory limit. On Apple silicon the GPU shares RAM with "
        "the system, and PyTorch caps what MPS may use (the high watermark)."
    ),
    patterns=MPS_PATTERNS,
    examples=(
        "RuntimeError: MPS backend out of memory (MPS allocated: 17.50 GB, other allocations: "
        "1.25 GB, max allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool.",
    ),
    summary=(
        "Tried to allocate {{asked}} with {{mps_allocated}} allocated by MPS and "
        "{{other_allocations}} elsewhere, against a limit of {{max_allowed}}.",
        "The MPS backend reached its memory limit.",
    ),
    extract=mps_fields,
    causes=(
        Cause("batch", "The batch, model and activations exceed what MPS may use.", weight=3),
        Cause(
            "limit",
            (
                "PyTorch caps what MPS may use at a share of the unified memory (the high "
                "watermark, {{max_allowed}} here); the machine may have more to give.",
                "PyTorch caps what MPS may use at a share of the unified memory (the high "
                "watermark); the machine may have more to give.",
            ),
            weight=1,
            signals=(r"HIGH_WATERMARK_RATIO",),
            boost=10,
        ),
        Cause(
            "other",
            "Other allocations (earlier models, cached tensors, other apps sharing unified "
            "memory) take part of the limit.",
            evidence="Other allocations ({{other_allocations}}) hold a large share of the "
            "limit: earlier models, cached tensors, or other apps using unified memory.",
            weight=1,
            when=lambda f: f["other_allocations_bytes"] >= 0.2 * f["max_allowed_bytes"],
        ),
    ),
    first_steps=(
        "Check torch.mps.current_allocated_memory() and torch.mps.driver_allocated_memory() "
        "after each phase.",
    ),
    fixes=(
        Fix(
            "Smaller batches with gradient accumulation",
            "loss = criterion(model(x), y) / accum\nloss.backward()",
            ("batch",),
        ),
        Fix(
            "Release cached blocks between phases",
            "torch.mps.empty_cache()",
            ("other",),
        ),
        Fix(
            "Raise the MPS memory cap (or use a smaller batch)",
            "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 python train.py  # no cap: the system may swap\n"
            "# a milder cap: PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.9 (a share of unified memory)",
            ("limit",),
        ),
    ),
)

ENTRIES = (OOM_CUDA, OOM_CPU, OOM_MPS)
