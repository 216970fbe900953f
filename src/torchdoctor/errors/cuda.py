"""CUDA runtime errors: device-side asserts, illegal accesses, cuBLAS/cuDNN, set-up problems."""

from __future__ import annotations

from torchdoctor.errors import facts, here
from torchdoctor.errors.catalog import LOWER_LR, Cause, Entry, Fields, Fix, first

_BLOCKING = (
    "Rerun with CUDA_LAUNCH_BLOCKING=1 so that kernels run synchronously and the traceback "
    "stops at the operation that failed; the line shown now may be a later, innocent one."
)


def _assert_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    assertion = first(r"Assertion [`'](.+?)[`'] failed", text)
    if assertion:
        f["assertion"] = assertion
    kernel = first(r"\.cuh?:\d+: (?:\w+ )*?(\w+)\(?[^:]*: block: \[", text) or first(
        r"\.cuh?:\d+: (\w+)", text
    )
    if kernel:
        f["kernel"] = kernel
    where = first(r"([\w/.-]+\.cuh?:\d+)", text)
    if where:
        f["kernel_source"] = where.rsplit("/", 1)[-1]
    return f


# what names BCE in a device-side assert's text: its kernel's assertion, the op, the module
_BCE = r"input_val >= zero && input_val <= one|binary_cross_entropy|BCELoss"

DEVICE_ASSERT = Entry(
    code="cuda.device_assert",
    title="CUDA device-side assert triggered",
    meaning=(
        "A check inside a CUDA kernel failed, most often an index out of range: a class label "
        ">= the number of classes, a token id >= the embedding size, a gather/scatter index "
        "past the end. CUDA reports it asynchronously, so the Python line in the traceback can "
        "be later than the real culprit, and the CUDA context is unusable afterwards."
    ),
    patterns=(
        r"device-side assert(?:ion)?s? triggered",
        r"cudaErrorAssert",
        r"\.cuh?:\d+: .*Assertion [`'].+[`'] failed",
    ),
    examples=(
        "RuntimeError: CUDA error: device-side assert triggered",
        "../aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: "
        "block: [0,0,0], thread: [3,0,0] Assertion `t >= 0 && t < n_classes` failed.\n"
        "RuntimeError: CUDA error: device-side assert triggered",
        "RuntimeError: cuda runtime error (59) : device-side assert triggered at "
        "/pytorch/aten/src/THC/generic/THCTensorMath.cu:26",
    ),
    summary=(
        "A CUDA kernel ({{kernel}}) failed its check `{{assertion}}`.",
        "A CUDA kernel failed its check `{{assertion}}`.",
        "A check inside a CUDA kernel failed; the kernel that failed may have run before the "
        "line in the traceback.",
    ),
    extract=_assert_fields,
    causes=(
        Cause(
            "labels",
            "A class label outside [0, num_classes) reached the loss: labels counted from 1, "
            "a void label such as 255 or -1 without ignore_index, or an output layer with too "
            "few classes.",
            weight=3,
            signals=(r"n_classes|nll_loss|ClassNLLCriterion|cross_entropy|cur_target",),
        ),
        Cause(
            "embedding",
            "A token or category id >= the embedding's num_embeddings (tokenizer and model "
            "vocabularies differ, added special tokens without resizing the embeddings, or "
            "sequences longer than the position embeddings).",
            weight=2,
            # nn.Embedding's index_select asserts in the vectorized gather kernel on new torch
            signals=(
                r"srcIndex < srcSelectDimSize|indexSelect|embedding|vectorized gather kernel",
            ),
        ),
        Cause(
            "index",
            "An index used by gather, scatter, index_select or advanced indexing is out of "
            "range for the dimension it indexes.",
            weight=1.5,
            signals=(r"index out of bounds|-sizes\[i\]|ScatterGather|IndexKernel|gather|scatter",),
        ),
        Cause(
            "bce",
            "BCELoss received values outside [0, 1]: logits instead of probabilities, or NaN.",
            weight=1,
            signals=(_BCE,),
        ),
        Cause(
            "bce_nan",
            "NaN reached BCELoss: the model's output went non-finite, most often a run that "
            "diverged under a learning rate too high for it.",
            weight=0.8,
            signals=(_BCE,),
        ),
        Cause(
            "invalid_values",
            "NaN or Inf reached a kernel that validates its input (torch.multinomial with "
            "invalid probabilities, an explicit _assert_async).",
            weight=0.5,
            signals=(r"multinomial|probability tensor|_assert_async",),
        ),
    ),
    first_steps=(
        _BLOCKING + " Add TORCH_USE_CUDA_DSA=1 on builds that support it for the assert's message.",
        "Run the same batch on the CPU: CPU kernels raise readable errors such as 'Target 10 "
        "is out of bounds'.",
        "Check value ranges before the failing op: labels.min() and labels.max() against the "
        "number of classes, token ids against the embedding size.",
        "Restart the process after fixing: a CUDA context that hit a device-side assert "
        "cannot be used again.",
    ),
    fixes=(
        Fix(
            "Check label range before the loss",
            "num_classes = logits.shape[1]\n"
            "assert 0 <= labels.min() and labels.max() < num_classes, (\n"
            "    labels.min().item(), labels.max().item(), num_classes)",
            ("labels",),
        ),
        Fix(
            "Ignore a void label instead of feeding it to the loss",
            "criterion = nn.CrossEntropyLoss(ignore_index=255)",
            ("labels",),
        ),
        Fix(
            "Keep ids inside the embedding",
            "emb = model.get_input_embeddings()\n"
            "assert input_ids.max() < emb.num_embeddings\n"
            "model.resize_token_embeddings(len(tokenizer))  # after adding tokens (HF)",
            ("embedding",),
        ),
        Fix(
            "Give BCE raw logits",
            "criterion = nn.BCEWithLogitsLoss()  # applies the sigmoid itself, stably",
            ("bce",),
        ),
        Fix(
            f"{LOWER_LR}: the run diverged to NaN",
            "optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)  # a tenth, say\n"
            "# the first op that goes non-finite: rerun under torchdoctor with --guard",
            ("bce_nan",),
        ),
        Fix(
            "Locate the failing kernel",
            "CUDA_LAUNCH_BLOCKING=1 TORCH_USE_CUDA_DSA=1 python train.py",
            ("index", "invalid_values"),
        ),
    ),
)

ILLEGAL_ACCESS = Entry(
    code="cuda.illegal_access",
    title="CUDA illegal memory access",
    meaning=(
        "A CUDA kernel read or wrote memory outside the buffers it was given (or at a "
        "misaligned address). It is reported asynchronously, at a later CUDA call, and the "
        "process cannot continue."
    ),
    patterns=(
        r"an illegal memory access was encountered",
        r"cudaErrorIllegalAddress",
        r"CUDA error: misaligned address",
        r"cudaErrorMisalignedAddress",
        r"an illegal instruction was encountered",
        r"unspecified launch failure",
    ),
    examples=(
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "RuntimeError: cuda runtime error (700) : an illegal memory access was encountered at "
        "/pytorch/aten/src/THC/THCCachingHostAllocator.cpp:278",
        "RuntimeError: CUDA error: misaligned address",
    ),
    summary=("A CUDA kernel accessed memory outside its buffers.",),
    causes=(
        Cause(
            "custom_kernel",
            "A custom CUDA or Triton kernel, or a compiled extension, indexes past its "
            "buffers (wrong index arithmetic, a non-contiguous input treated as contiguous).",
            weight=2,
            signals=(r"triton|extension|apex|flash_attn|xformers|bitsandbytes|deepspeed|\.so\b",),
        ),
        Cause(
            "index",
            "An out-of-range index in an indexing operation whose kernel has no bounds check.",
            weight=1.5,
        ),
        Cause(
            "shapes",
            "Tensors with unexpected shapes or strides passed to a fused or custom kernel "
            "that trusts its inputs.",
            weight=1,
        ),
        Cause(
            "hardware",
            "Failing hardware or driver: Xid or ECC errors in the kernel log, especially when "
            "the error moves around between runs.",
            weight=0.5,
            signals=(r"\bXid\b|\bECC\b",),
        ),
        Cause(
            "versions",
            "An extension or library built against another CUDA or PyTorch version.",
            weight=0.3,
        ),
    ),
    first_steps=(
        _BLOCKING,
        "Run the memory checker: `compute-sanitizer --tool memcheck python train.py` (slow; "
        "use a tiny input).",
        "Turn off custom kernels, fused optimizers and torch.compile one at a time to find the "
        "kernel at fault.",
        "Check `dmesg` for Xid errors from the GPU driver.",
    ),
    fixes=(
        Fix(
            "Find the kernel",
            "CUDA_LAUNCH_BLOCKING=1 python train.py\n"
            "compute-sanitizer --tool memcheck python train.py",
            ("custom_kernel", "index", "shapes"),
        ),
        Fix(
            "Give custom kernels the layout they assume",
            "x = x.contiguous()  # before calling a kernel that assumes a dense layout",
            ("custom_kernel", "shapes"),
        ),
    ),
)

CUBLAS_ALLOC = Entry(
    code="cublas.alloc",
    title="cuBLAS could not allocate its workspace",
    meaning=(
        "cuBLAS failed to create its handle or allocate its workspace, almost always because "
        "the GPU's memory is already taken. PyTorch creates the handle lazily, at the first "
        "matrix multiplication on a device, so this often appears at the first Linear layer."
    ),
    patterns=(
        r"CUBLAS_STATUS_ALLOC_FAILED",
        r"CUBLAS_STATUS_NOT_INITIALIZED when calling `?cublasCreate",
    ),
    examples=(
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling "
        "`cublasCreate(handle)`",
    ),
    summary=(
        "cuBLAS could not allocate memory when calling {{call}}: the GPU is (nearly) full.",
        "cuBLAS could not allocate memory: the GPU is (nearly) full.",
    ),
    extract=lambda message, text: (
        {"call": c} if (c := first(r"when calling `?(\w+)", message)) else {}
    ),
    causes=(
        Cause(
            "memory",
            "The GPU is (nearly) full: the model, the batch and PyTorch's cache leave no room "
            "for the cuBLAS workspace.",
            weight=3,
        ),
        Cause(
            "other_process",
            "Another process uses the GPU, or every rank created its context on GPU 0 "
            "(torch.cuda.set_device(local_rank) missing).",
            weight=1,
        ),
        Cause(
            "earlier_error",
            "An earlier asynchronous error (often an out-of-range index in an embedding) broke "
            "the CUDA context and cuBLAS is only the first to notice.",
            weight=0.8,
            signals=(r"NOT_INITIALIZED",),
        ),
        Cause(
            "versions",
            "A CUDA toolkit or driver that does not match the PyTorch build.",
            weight=0.2,
        ),
    ),
    first_steps=(
        "Check `nvidia-smi` for how much memory is in use, and by whom, before the failing call.",
        _BLOCKING,
    ),
    fixes=(
        Fix(
            "Leave GPU memory for cuBLAS's workspace",
            "# a smaller batch or model, or a GPU nothing else uses (nvidia-smi):\n"
            "CUDA_VISIBLE_DEVICES=1 python train.py\n"
            "torch.cuda.empty_cache()  # give cached blocks back before the first matmul",
            ("memory",),
        ),
        Fix(
            "One GPU per process",
            'local_rank = int(os.environ["LOCAL_RANK"])\ntorch.cuda.set_device(local_rank)',
            ("other_process",),
        ),
        Fix(
            "Expose the real first error",
            "CUDA_LAUNCH_BLOCKING=1 python train.py",
            ("earlier_error",),
        ),
    ),
)

CUBLAS_ERROR = Entry(
    code="cublas.error",
    title="cuBLAS execution error",
    meaning=(
        "A cuBLAS call failed while running (not while allocating). Either the inputs are "
        "unsupported for that routine, or an earlier kernel already corrupted the context."
    ),
    patterns=(
        r"CUBLAS_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR|INVALID_VALUE|NOT_SUPPORTED"
        r"|ARCH_MISMATCH|MAPPING_ERROR)",
    ),
    examples=(
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( "
        "handle, opa, opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`",
        "RuntimeError: CUDA error: CUBLAS_STATUS_INVALID_VALUE when calling "
        "`cublasGemmStridedBatchedExFix(...)`",
    ),
    summary=("cuBLAS failed with {{status}} in {{call}}.", "cuBLAS failed with {{status}}."),
    extract=lambda message, text: {
        k: v
        for k, v in (
            ("status", first(r"(CUBLAS_STATUS_\w+)", message)),
            ("call", first(r"when calling `?(\w+)", message)),
        )
        if v
    },
    causes=(
        Cause(
            "earlier_error",
            "An earlier asynchronous CUDA error (an out-of-range index, an illegal access) "
            "surfaced in the next cuBLAS call.",
            weight=2,
            signals=(r"EXECUTION_FAILED|INTERNAL_ERROR",),
        ),
        Cause(
            "shapes",
            "Shapes, strides or dtypes the routine does not support (zero-sized or huge "
            "batched matrices, half precision on an old GPU).",
            weight=1.5,
            signals=(r"INVALID_VALUE|NOT_SUPPORTED",),
        ),
        Cause(
            "versions",
            "The PyTorch build does not fit the GPU or the CUDA libraries it finds: a build "
            "for an older CUDA on a newer GPU, or a cuBLAS from another CUDA on the library "
            "path. The error then stays in this call under CUDA_LAUNCH_BLOCKING=1.",
            weight=0.5,
            when=lambda f: facts.blackwell(f) or None,
            boost=12,
        ),
    ),
    first_steps=(_BLOCKING, "Print the shapes, strides and dtypes of the matmul's operands."),
    fixes=(
        Fix(
            "Expose the real first error; if it stays in cuBLAS, install a build for this GPU",
            "CUDA_LAUNCH_BLOCKING=1 python train.py   # an earlier error now shows its own line\n"
            "# still cuBLAS: a torch built for this GPU and driver\n"
            "pip install torch --index-url https://download.pytorch.org/whl/cu126",
            ("earlier_error", "versions"),
        ),
        Fix(
            "Give cuBLAS plain inputs",
            "a, b = a.contiguous().float(), b.contiguous().float()",
            ("shapes",),
        ),
    ),
)

CUDNN_ERROR = Entry(
    code="cudnn.error",
    title="cuDNN error",
    meaning=(
        "A cuDNN routine (convolutions, RNNs, normalisation) failed. Many of these are "
        "out-of-memory conditions in disguise: cuDNN needs workspace memory to run the "
        "algorithm it picked."
    ),
    patterns=(
        r"CUDNN_STATUS_\w+",
        r"cuDNN error",
        r"Unable to find a valid cuDNN algorithm",
        r"(?:GET|FIND) was unable to find an engine to execute this computation",
        r"cuDNN Frontend error",
        r"CUDNN_BACKEND_\w+",
    ),
    examples=(
        "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR",
        "RuntimeError: Unable to find a valid cuDNN algorithm to run convolution",
        "RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED",
    ),
    summary=("cuDNN failed with {{status}}.", "cuDNN could not run the operation."),
    extract=lambda message, text: (
        {"status": s} if (s := first(r"(CUDNN_STATUS_\w+)", message)) else {}
    ),
    causes=(
        Cause(
            "memory",
            "Not enough GPU memory for cuDNN's workspace: this usually is an out-of-memory "
            "error reported by cuDNN.",
            weight=2,
            signals=(
                r"valid cuDNN algorithm|NOT_INITIALIZED|ALLOC_FAILED|INTERNAL_ERROR|"
                r"unable to find an engine",
            ),
        ),
        Cause(
            "inputs",
            "Unsupported inputs: non-contiguous or channels-last tensors with an unusual "
            "layout, very large batch for the kernel, or NaN in RNN inputs.",
            weight=1,
            signals=(r"BAD_PARAM|NOT_SUPPORTED",),
        ),
        Cause(
            "versions",
            "A cuDNN library that does not match the PyTorch build or the driver (a second "
            "cuDNN on LD_LIBRARY_PATH, a GPU newer than the build: cuDNN's v8 API then finds "
            "no engine for the layer).",
            weight=0.5,
            signals=(r"VERSION_MISMATCH|ARCH_MISMATCH|unable to find an engine",),
            boost=1,
        ),
    ),
    first_steps=(
        "Rerun with a smaller batch: if the error goes away, it was memory.",
        "Try torch.backends.cudnn.enabled = False to confirm cuDNN is the component failing.",
        _BLOCKING,
    ),
    fixes=(
        Fix("Smaller batch or mixed precision", "batch_size //= 2", ("memory",)),
        Fix("Plain layouts for cuDNN", "x = x.contiguous()", ("inputs",)),
        Fix(
            "Rule cuDNN in or out",
            "torch.backends.cudnn.enabled = False  # diagnosis only: much slower",
            ("versions", "inputs"),
        ),
    ),
)

NOT_AVAILABLE = Entry(
    code="cuda.not_available",
    title="CUDA is not available",
    meaning=(
        "The code asked for a CUDA device but this PyTorch cannot use one: a CPU-only build, "
        "no (or too old) NVIDIA driver, or no GPU visible to the process."
    ),
    patterns=(
        r"Torch not compiled with CUDA enabled",
        r"Found no NVIDIA driver on your system",
        r"NVIDIA driver on your system is too old",
        r"CUDA driver version is insufficient for CUDA runtime version",
        r"No CUDA GPUs are available",
        r"no CUDA-capable device is detected",
    ),
    examples=(
        "AssertionError: Torch not compiled with CUDA enabled",
        "RuntimeError: Found no NVIDIA driver on your system.",
        "RuntimeError: No CUDA GPUs are available",
    ),
    summary=("This PyTorch cannot use a CUDA device here.",),
    causes=(
        Cause(
            "cpu_build",
            "A CPU-only build of PyTorch is installed (pip picked the CPU wheel).",
            weight=1,
            signals=(r"not compiled with CUDA",),
        ),
        Cause(
            "driver",
            "No NVIDIA driver, or one older than the CUDA version PyTorch was built with.",
            weight=1,
            signals=(r"driver",),
        ),
        Cause(
            "visibility",
            "No GPU is visible: CUDA_VISIBLE_DEVICES is empty or wrong, the container was "
            "started without --gpus, or the job scheduler gave no GPU.",
            weight=1,
            signals=(r"No CUDA GPUs|no CUDA-capable",),
        ),
    ),
    first_steps=(
        'Run `python -c "import torch; print(torch.__version__, torch.version.cuda, '
        'torch.cuda.is_available())"` and `nvidia-smi`.',
    ),
    fixes=(
        Fix(
            "Install a CUDA build",
            "pip install torch --index-url https://download.pytorch.org/whl/cu124",
            ("cpu_build",),
        ),
        Fix(
            "Fall back to the CPU when there is no GPU",
            'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")',
            ("visibility", "driver", "cpu_build"),
        ),
    ),
)

INVALID_DEVICE = Entry(
    code="cuda.invalid_device",
    title="Invalid CUDA device ordinal",
    meaning="The code selected a GPU index that does not exist in this process.",
    patterns=(r"invalid device ordinal", r"cudaErrorInvalidDevice"),
    examples=(
        "RuntimeError: CUDA error: invalid device ordinal",
        "torch.AcceleratorError: CUDA error: invalid device ordinal",
    ),
    summary=("A CUDA device index beyond the GPUs visible to this process was used.",),
    causes=(
        Cause(
            "nproc",
            "More processes than GPUs: torchrun --nproc_per_node is larger than the number of "
            "GPUs, so a LOCAL_RANK has no device.",
            weight=2,
            signals=(r"local_rank|LOCAL_RANK|set_device",),
        ),
        Cause(
            "visible",
            "CUDA_VISIBLE_DEVICES hides GPUs: inside the process the visible ones are "
            "renumbered from 0.",
            weight=1.5,
            signals=(r"CUDA_VISIBLE_DEVICES",),
        ),
        Cause(
            "hardcoded",
            "A GPU index that this machine does not have: a default of the script (--gpu 1, "
            "'cuda:1', a list of GPUs written for another machine), or a checkpoint restored "
            "to the GPU it was saved from.",
            weight=2.2,
            signals=(r"cuda:\d|torch\.load",),
        ),
    ),
    first_steps=(
        "Print torch.cuda.device_count(), CUDA_VISIBLE_DEVICES and LOCAL_RANK in the failing "
        "process.",
    ),
    fixes=(
        Fix(
            "Use a GPU index that exists (they count from 0 among the visible GPUs)",
            "CUDA_VISIBLE_DEVICES=0 python train.py --gpu 0\n"
            "assert idx < torch.cuda.device_count(), (idx, torch.cuda.device_count())",
            ("visible", "hardcoded"),
        ),
        Fix(
            "As many processes as GPUs",
            "torchrun --nproc_per_node=gpu train.py  # one process per visible GPU",
            ("nproc",),
        ),
        Fix(
            "Map checkpoints to the current device",
            'state = torch.load(path, map_location=f"cuda:{local_rank}", weights_only=True)',
            ("hardcoded",),
        ),
    ),
)

NO_KERNEL_IMAGE = Entry(
    code="cuda.no_kernel_image",
    title="No CUDA kernel for this GPU",
    meaning=(
        "This PyTorch build has no kernels compiled for this GPU's architecture (too new or "
        "too old for the wheel)."
    ),
    patterns=(
        r"no kernel image is available(?: for execution on the device)?",
        r"CUDA capability sm_\d+ is not compatible",
    ),
    examples=(
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
    ),
    summary=(
        "The GPU (sm_{{sm}}) is not supported by this PyTorch build.",
        "This PyTorch build has no kernels for this GPU.",
    ),
    extract=lambda message, text: {"sm": s} if (s := first(r"sm_(\d+)", text)) else {},
    causes=(
        Cause(
            "wheel",
            "The installed wheel does not include this GPU architecture: a new GPU with an "
            "old PyTorch, or an old GPU dropped by a new one.",
            weight=2,
        ),
        Cause(
            "driver",
            "The driver is older than the CUDA this PyTorch was built for: even a build that "
            "includes the GPU (cu128 for an RTX 50) needs a driver that knows its CUDA.",
            evidence="The driver ({{driver}}, up to CUDA {{driver_cuda}}) is older than the "
            "CUDA this PyTorch was built for ({{cuda_build}}): a build that includes the GPU "
            "still needs a driver that knows its CUDA.",
            weight=0.3,
            when=lambda f: here.driver_too_old(f),
            boost=20,
        ),
        Cause("extension", "A compiled extension built for other architectures.", weight=0.5),
    ),
    first_steps=("Compare torch.cuda.get_device_capability() with torch.cuda.get_arch_list().",),
    fixes=(
        Fix(
            "Install a build that supports the GPU",
            "pip install --upgrade torch --index-url https://download.pytorch.org/whl/cu128",
            ("wheel",),
        ),
        Fix(
            "Update the NVIDIA driver to one for the build's CUDA",
            "nvidia-smi   # 'CUDA Version' in its header must be >= torch.version.cuda\n"
            "# CUDA 12.8 builds (RTX 50, B200) need driver 570 or newer",
            ("driver",),
            needs=("driver_cuda",),
            check="Compare the 'CUDA Version' in nvidia-smi's header with torch.version.cuda.",
        ),
        Fix(
            "Rebuild extensions for this GPU",
            'TORCH_CUDA_ARCH_LIST="8.0;9.0" pip install --no-build-isolation .',
            ("extension",),
        ),
    ),
)

FORKED = Entry(
    code="cuda.forked_subprocess",
    title="CUDA used in a forked subprocess",
    meaning=(
        "CUDA cannot be initialised again in a child process created by fork after the parent "
        "already used CUDA. DataLoader workers and multiprocessing pools fork by default on "
        "Linux."
    ),
    patterns=(r"Cannot re-initialize CUDA in forked subprocess",),
    examples=(
        "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
        "multiprocessing, you must use the 'spawn' start method",
    ),
    summary=("A forked child process tried to use CUDA after the parent initialised it.",),
    causes=(
        Cause(
            "dataset_cuda",
            "The Dataset (or collate_fn) moves data to the GPU or calls CUDA inside "
            "DataLoader workers.",
            weight=1,
            signals=(r"DataLoader|_worker_loop|__getitem__|collate",),
            boost=2,
        ),
        Cause(
            "pool",
            "A multiprocessing pool or Process started with fork after CUDA was initialised "
            "(on Linux fork is the default start method).",
            weight=1.5,
            signals=(r"multiprocessing[/\\.](?:pool|process|context)|Pool\(|Process\(",),
        ),
    ),
    first_steps=("Find the CUDA call in the worker's traceback (Original Traceback).",),
    fixes=(
        Fix(
            "Start the processes with spawn",
            'torch.multiprocessing.set_start_method("spawn", force=True)  # in __main__\n'
            'loader = DataLoader(ds, num_workers=4, multiprocessing_context="spawn")',
            ("pool",),
        ),
        Fix(
            "Keep workers on the CPU; move the batch in the training loop",
            "for x, y in loader:  # pin_memory=True in the DataLoader\n"
            "    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)",
            ("dataset_cuda",),
        ),
    ),
)

ENTRIES = (
    DEVICE_ASSERT,
    ILLEGAL_ACCESS,
    CUBLAS_ALLOC,
    CUBLAS_ERROR,
    CUDNN_ERROR,
    NOT_AVAILABLE,
    INVALID_DEVICE,
    NO_KERNEL_IMAGE,
    FORKED,
)
