"""Data problems: labels and indices out of range, DataLoader workers."""

from __future__ import annotations

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix, first


def _target_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    label = first(r"Target (-?\d+) (?:is )?out of bounds", message)
    if label is not None:
        f["label"] = int(label)
        if f["label"] >= 0:
            f["classes_needed"] = f["label"] + 1
    classes = first(r"\b(?:num_classes|n_classes|nclasses)\s*[=:]\s*(\d+)", text)
    if classes is not None:
        f["num_classes"] = int(classes)
    return f


TARGET_OUT_OF_BOUNDS = Entry(
    code="index.target_out_of_bounds",
    title="Class label out of range",
    meaning=(
        "cross_entropy and nll_loss take class indices in [0, C), where C is the size of the "
        "logits' class dimension. A label outside that range has no logit to pick. On the "
        "CPU this is an IndexError naming the label; on a GPU it is a device-side assert."
    ),
    patterns=(
        r"Target -?\d+ is out of bounds",
        r"Target -?\d+ out of bounds at \S*ClassNLLCriterion",
        r"cur_target >= 0 && cur_target < n_classes",
        r"\bt >= 0 && t < n_classes",
    ),
    priority=3,
    examples=(
        "IndexError: Target 10 is out of bounds.",
        "IndexError: Target 255 is out of bounds.",
        "RuntimeError: Assertion `cur_target >= 0 && cur_target < n_classes' failed.  at "
        "/pytorch/aten/src/THNN/generic/ClassNLLCriterion.c:94",
    ),
    summary=(
        "Label {{label}} reached the loss but the model has {{num_classes}} classes, so "
        "labels must lie in [0, {{num_classes}}).",
        "Label {{label}} reached the loss; labels must lie in [0, C) where C is the number of "
        "logits per sample.",
        "A class label outside [0, number of classes) reached the loss.",
    ),
    extract=_target_fields,
    causes=(
        Cause(
            "void_label",
            "The labels contain an 'ignore' value (255 for void pixels in segmentation masks, "
            "-1 for padding) that the loss was not told about (ignore_index).",
            evidence="{{label}} is a typical 'ignore' label (255 marks void pixels in "
            "segmentation masks, -1 marks padding): tell the loss with "
            "ignore_index={{label}}.",
            only_when=True,
            weight=0,
            when=lambda f: f["label"] in (255, -1),
            boost=12,
        ),
        Cause(
            "one_based",
            "Labels are counted from 1 instead of 0, so the largest label is one past the "
            "last valid index.",
            evidence="Labels are counted from 1 instead of 0: label {{label}} equals the "
            "number of classes, one past the last valid index.",
            weight=1.5,
            when=lambda f: f["label"] == f["num_classes"],
            boost=12,
        ),
        Cause(
            "head_too_small",
            (
                "The output layer has fewer classes than the data: label {{label}} needs at "
                "least {{classes_needed}} outputs.",
                "The output layer has fewer classes than the data.",
            ),
            weight=2,
        ),
        Cause(
            "mask_pixels",
            "Segmentation masks were read as pixel values (0-255 greyscale, or RGB colours) "
            "instead of class indices: a label this large is a grey level, not a class.",
            evidence="Label {{label}} looks like a grey level: segmentation masks were read "
            "as pixel values (0-255) instead of class indices.",
            weight=0.5,
            when=lambda f: 100 <= f["label"] < 255 and f.get("num_classes", 0) < 100,
            signals=(r"mask|segment|seg_|unet|deeplab|\.png",),
            boost=12,
        ),
        Cause(
            "wrong_column",
            "The targets are not class indices at all: a wrong column, pixel values or boxes "
            "used as labels, or one-hot labels turned into indices along the wrong dimension.",
            weight=1,
        ),
        Cause(
            "negative",
            "Negative labels: a missing-value marker in the data.",
            evidence="A negative label ({{label}}): a missing-value marker in the data.",
            only_when=True,
            weight=0,
            when=lambda f: f["label"] < 0 and f["label"] != -1,
            boost=12,
        ),
    ),
    first_steps=(
        "Compare labels.min() and labels.max() with the model's number of outputs "
        "(logits.shape[1]), over the whole dataset, not just one batch.",
        "Look at the distinct label values: torch.unique(labels).",
    ),
    fixes=(
        Fix(
            ("Ignore the void label {{label}}", "Ignore the void label"),
            (
                "criterion = nn.CrossEntropyLoss(ignore_index={{label}})",
                "criterion = nn.CrossEntropyLoss(ignore_index=255)",
            ),
            ("void_label", "negative"),
        ),
        Fix(
            "Shift 1-based labels", "labels = labels - 1  # classes 1..C -> 0..C-1", ("one_based",)
        ),
        Fix(
            "Turn mask pixel values into class indices",
            'mask = np.array(Image.open(path).convert("L"))\n'
            "mask = torch.from_numpy((mask > 127).astype(np.int64))   # two classes\n"
            "# more classes: a lookup table from each grey level or colour to its class",
            ("mask_pixels",),
        ),
        Fix(
            "Size the head from the data",
            "num_classes = int(max(int(y) for _, y in dataset)) + 1\n"
            "model.fc = nn.Linear(model.fc.in_features, num_classes)",
            ("head_too_small",),
        ),
        Fix(
            "Check the range before the loss",
            "assert 0 <= y.min() and y.max() < logits.shape[1], (y.min().item(), y.max().item())",
            ("wrong_column", "head_too_small"),
        ),
    ),
)


def _index_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    for name, pattern in (
        ("index", r"index (-?\d+) is out of bounds"),
        ("dim", r"for (?:dimension|axis) (\d+)"),
        ("size", r"with size (\d+)"),
    ):
        value = first(pattern, message)
        if value is not None:
            f[name] = int(value)
    return f


INDEX_OUT_OF_RANGE = Entry(
    code="index.out_of_range",
    title="Index out of range",
    meaning=(
        "An index is outside the dimension it addresses. 'index out of range in self' comes "
        "from nn.Embedding: an id >= num_embeddings."
    ),
    patterns=(
        r"index out of range in self",
        r"^(?:IndexError|RuntimeError): index out of range(?: at \S*(?:TH|ATen|aten)\S*)?\s*$",
        r"^(?:RuntimeError: )?index out of range at \S*(?:/TH|aten/)",
        r"index -?\d+ is out of bounds for (?:dimension|axis) \d+ with size \d+",
        r"srcIndex < srcSelectDimSize",
    ),
    priority=3,
    examples=(
        "IndexError: index out of range in self",
        "IndexError: index 5 is out of bounds for dimension 0 with size 3",
        "Indexing.cu:1237: indexSelectLargeIndex: block: [10,0,0], thread: [64,0,0] Assertion "
        "`srcIndex < srcSelectDimSize` failed.",
    ),
    summary=(
        "Index {{index}} was used on dimension {{dim}} of size {{size}}.",
        "An embedding lookup got an id >= num_embeddings.",
    ),
    extract=_index_fields,
    causes=(
        Cause(
            "vocab",
            "A token id is >= the embedding's num_embeddings: tokenizer and model vocabularies "
            "differ, or tokens were added without resizing the embeddings.",
            weight=1,
            signals=(r"index out of range in self|srcIndex|embedding|THTensorEvenMoreMath",),
            boost=12,
        ),
        Cause(
            "positions",
            "The sequence is longer than the position embeddings (max_position_embeddings, "
            "block_size).",
            weight=0.5,
            signals=(r"position|pos_emb|wpe|block_size",),
            boost=12,
        ),
        Cause(
            "indexing",
            "An index computed from data (a sample index, a class id, a gather index) is past "
            "the end of the tensor it indexes.",
            weight=1.5,
            when=lambda f: "index" in f,
        ),
    ),
    first_steps=(
        "Compare the largest id with the embedding size: ids.max() against "
        "embedding.num_embeddings; and the sequence length against the position limit.",
        "Run on the CPU for a readable error if the GPU reports a device-side assert.",
    ),
    fixes=(
        Fix(
            "Keep ids inside the embeddings: the vocabulary and the sequence length",
            "print(ids.max(), model.get_input_embeddings().num_embeddings, ids.shape[-1])\n"
            "model.resize_token_embeddings(len(tokenizer))   # ids beyond the vocabulary\n"
            "enc = tokenizer(texts, truncation=True,          # longer than the positions\n"
            "                max_length=model.config.max_position_embeddings)",
            ("vocab",),
        ),
        Fix(
            "Truncate to the model's context",
            "limit = model.config.max_position_embeddings\n"
            "enc = tokenizer(texts, truncation=True, max_length=limit)",
            ("positions",),
        ),
        Fix(
            "Check indices before use",
            "assert 0 <= idx.min() and idx.max() < x.size(dim)",
            ("indexing",),
        ),
    ),
)


def _worker_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    pid = first(r"DataLoader worker \(pids?\(?s?\)? ([\d, ]+)\)", message)
    if pid:
        f["pid"] = pid.strip()
    signal = first(r"killed by signal: ([A-Za-z][\w ]*?)\.?\s*$", message) or first(
        r"killed by signal: ([A-Za-z][\w ]*?)\.", message
    )
    if signal:
        f["signal"] = signal
    elif first(r"(bus error)", text):
        f["signal"] = "Bus error"
    return f


WORKER_KILLED = Entry(
    code="dataloader.worker_killed",
    title="DataLoader worker killed",
    meaning=(
        "A DataLoader worker process died without raising a Python error: the kernel killed "
        "it (out of host memory), it crashed in native code, or it could not write a batch "
        "to shared memory. The signal names which."
    ),
    patterns=(
        r"DataLoader worker \(pids?\(?s?\)? [\d, ]+\) (?:is killed by signal|exited unexpectedly)",
        r"Unexpected bus error encountered in worker",
        r"insufficient shared memory \(shm\)",
        r"dataloader's workers are out of shared memory",
    ),
    priority=5,
    examples=(
        "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.",
        "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. It is "
        "possible that dataloader's workers are out of shared memory. Please try to raise your "
        "shared memory limit.",
        "RuntimeError: DataLoader worker (pid(s) 4242, 4243) exited unexpectedly",
    ),
    summary=(
        "DataLoader worker {{pid}} died from signal '{{signal}}'.",
        "DataLoader worker {{pid}} died.",
        "A DataLoader worker died.",
    ),
    extract=_worker_fields,
    causes=(
        Cause(
            "host_oom",
            "Host RAM ran out and the kernel's OOM killer ended the worker: too many workers, "
            "each holding a copy of the dataset, a large prefetch_factor, or memory growing in "
            "__getitem__.",
            weight=1.5,
            signals=(r"signal: Killed|SIGKILL",),
        ),
        Cause(
            "shm",
            "/dev/shm is too small to pass batches between processes; containers get 64 MB by "
            "default.",
            weight=1.5,
            signals=(r"Bus error|shared memory|\bshm\b",),
        ),
        Cause(
            "native_crash",
            "Native code crashed inside the worker: OpenCV or a BLAS using threads after "
            "fork, a corrupt image, an incompatible extension.",
            weight=1,
            signals=(r"Segmentation fault|SIGSEGV|Aborted|SIGABRT",),
        ),
        Cause(
            "earlier_error",
            "The worker printed an error earlier in the log; the real traceback is above.",
            weight=0.5,
            signals=(r"exited unexpectedly",),
        ),
    ),
    first_steps=(
        "Run with num_workers=0: a Python error in the dataset then surfaces directly, and "
        "memory or shared-memory problems disappear.",
        "Check `dmesg -T | grep -i killed` for the OOM killer and `df -h /dev/shm` for the "
        "shared-memory size.",
    ),
    fixes=(
        Fix(
            "Fewer workers and less prefetch",
            "loader = DataLoader(ds, batch_size=64, num_workers=4, prefetch_factor=2,\n"
            "                    persistent_workers=True, pin_memory=True)",
            ("host_oom",),
        ),
        Fix(
            "More shared memory (containers)",
            "docker run --shm-size=16g ...   # or --ipc=host",
            ("shm",),
        ),
        Fix(
            "Share tensors through files instead of /dev/shm",
            'torch.multiprocessing.set_sharing_strategy("file_system")',
            ("shm",),
        ),
        Fix(
            "No threads in forked workers",
            "cv2.setNumThreads(0)\n"
            'loader = DataLoader(ds, num_workers=4, multiprocessing_context="spawn")',
            ("native_crash",),
        ),
    ),
)

WORKER_ERROR = Entry(
    code="dataloader.worker_error",
    title="Error inside a DataLoader worker",
    meaning=(
        "The Dataset's __getitem__ or the collate function raised in a worker process. The "
        "worker's own traceback is printed after 'Original Traceback' and its last line is "
        "the real error."
    ),
    patterns=(
        r"Caught \w+ in DataLoader worker process \d+",
        # torch <= 0.4: the worker's traceback is the message of the re-raised exception.
        r"^\w+(?:Error|Exception): Traceback \(most recent call last\):?\s*$",
    ),
    priority=-1,
    examples=(
        "KeyError: Caught KeyError in DataLoader worker process 0. Original Traceback (most "
        "recent call last): ... KeyError: 'label'",
    ),
    summary=(
        "Worker {{worker}} raised {{error_type}} while loading a batch; the worker's own "
        "traceback shows where.",
    ),
    extract=lambda message, text: {
        k: v
        for k, v in (
            ("error_type", first(r"Caught (\w+) in DataLoader", message)),
            ("worker", first(r"worker process (\d+)", message)),
        )
        if v is not None
    },
    causes=(
        Cause(
            "dataset_bug",
            "A bug in the Dataset or the transforms for some samples (a missing key, a "
            "corrupt file, an unexpected format).",
            weight=2,
        ),
        Cause(
            "collate",
            "The collate function cannot combine the samples (different sizes or types).",
            weight=1,
            signals=(r"collate",),
        ),
    ),
    first_steps=(
        "Read the last line of the 'Original Traceback': it is the worker's error.",
        "Reproduce with num_workers=0 and index the dataset directly (dataset[i]) to debug "
        "in-process.",
    ),
    fixes=(
        Fix(
            "Find the bad sample",
            "for i in range(len(ds)):\n    try:\n        ds[i]\n    except Exception as e:\n"
            "        print(i, repr(e))",
            ("dataset_bug", "collate"),
        ),
    ),
)

LOADER_TIMEOUT = Entry(
    code="dataloader.timeout",
    title="DataLoader timed out",
    meaning="No batch arrived from the workers within the DataLoader's timeout.",
    patterns=(r"DataLoader timed out after \d+ seconds",),
    examples=("RuntimeError: DataLoader timed out after 120 seconds",),
    summary=("No batch arrived within {{seconds}} s.", "No batch arrived in time."),
    extract=lambda message, text: (
        {"seconds": int(s)} if (s := first(r"timed out after (\d+) seconds", message)) else {}
    ),
    causes=(
        Cause("slow_io", "Reading samples is slow (network storage, large files).", weight=1.5),
        Cause(
            "deadlock",
            "A worker is stuck (a lock inherited through fork, threads in native libraries).",
            weight=1,
        ),
    ),
    first_steps=("Time dataset[i] directly; dump the workers' stacks with py-spy.",),
    fixes=(
        Fix(
            "Faster data, longer timeout",
            "loader = DataLoader(ds, num_workers=8, timeout=600, persistent_workers=True)",
            ("slow_io",),
        ),
        Fix(
            "Spawn instead of fork",
            'loader = DataLoader(ds, num_workers=4, multiprocessing_context="spawn")',
            ("deadlock",),
        ),
    ),
)

ENTRIES = (TARGET_OUT_OF_BOUNDS, INDEX_OUT_OF_RANGE, WORKER_KILLED, WORKER_ERROR, LOADER_TIMEOUT)
