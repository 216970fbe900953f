"""How explain reads a paste: the error line finder (no exception class, hints after the error,
interleaved ranks, terminal wrapping, one-line tracebacks, Markdown and Rich boxes), the facts
a text states, how sure the answer is, and fixes that say what to check. The texts are real
wordings (PyTorch's, from the explain corpus's threads) in the shapes users paste them."""

from __future__ import annotations

from torchdoctor.errors import extract, facts
from torchdoctor.errors.api import explain_text

DYNAMO = (
    "torch._dynamo.exc.Unsupported: Dynamic control flow is not supported at the moment. Please "
    "use functorch.experimental.control_flow.cond to explicitly capture the control flow."
)
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 23.65 GiB of which 1.03 GiB is free. Process 2314 has 22.61 GiB memory in use."
)


# --- the error line ---------------------------------------------------------------------


def test_hints_after_the_error_are_not_the_error() -> None:
    text = (
        f"{DYNAMO}\n\nSet TORCHDYNAMO_VERBOSE=1 for the internal stack trace (please do this "
        "especially if you're reporting a bug to PyTorch). For even more developer context, set "
        'TORCH_LOGS="+dynamo"\n'
    )
    e = explain_text(text)
    assert e.category == "compile.graph_break" and e.line == 1
    lines = extract.clean(text)
    assert lines[-1].hint and not lines[0].hint


def test_a_hint_naming_an_error_is_not_one() -> None:
    text = (
        "RuntimeError: CUDA error: device-side assert triggered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.\nFor debugging consider passing "
        "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side "
        "assertions.\n"
    )
    e = explain_text(text)
    assert (e.category, e.line) == ("cuda.device_assert", 1)


def test_an_embedding_lookup_past_the_end_on_new_torch_ranks_the_embedding_first() -> None:
    # As torch 2.11 printed it on an H100 (tests/scripts/cuda_device_assert.py): nn.Embedding's
    # index_select asserts in the vectorized gather kernel, a name that says "gather" only.
    text = (
        "/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: "
        "block: [0,0,0], thread: [0,0,0] Assertion `ind >=0 && ind < ind_dim_size && "
        '"vectorized gather kernel index out of bounds"` failed.\n'
        "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
    )
    e = explain_text(text)
    assert e.category == "cuda.device_assert" and e.fields["kernel"] == "vectorized_gather_kernel"
    assert "embedding" in e.causes[0]


def test_no_exception_class() -> None:
    for text, category in (
        ("GET was unable to find an engine to execute this computation", "cudnn.error"),
        (DYNAMO.split(": ", 1)[1], "compile.graph_break"),
        ("IndexError: index out of range", "index.out_of_range"),
        (
            "RuntimeError: index out of range at /pytorch/aten/src/TH/generic/"
            "THTensorEvenMoreMath.cpp:191",
            "index.out_of_range",
        ),
    ):
        e = explain_text(text)
        assert e.category == category, (text, e.category)


def test_torch_0_4_dataloader_re_raise() -> None:
    text = (
        '  File "train.py", line 40, in <module>\n'
        "    for i, batch in enumerate(loader):\n"
        "ValueError: Traceback (most recent call last):\n"
        '  File "/opt/conda/lib/python3.6/site-packages/torch/utils/data/dataloader.py", line '
        "138, in _worker_loop\n"
        "    samples = collate_fn([dataset[i] for i in batch_indices])\n"
        '  File "/data/ds.py", line 52, in __getitem__\n'
        '    raise ValueError("Sample larger than population or is negative")\n'
    )
    assert explain_text(text).category == "dataloader.worker_error"


def test_interleaved_ranks_keep_apart() -> None:
    text = (
        "[rank0]: Traceback (most recent call last):\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank0]:   File "a.py", line 1, in <module>\n'
        '[rank1]:   File "a.py", line 2, in <module>\n'
        "[rank0]: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [10.0.0.3]:43627\n"
    )
    e = explain_text(text)
    assert (e.category, e.rank) == ("oom.cuda", 0)
    assert [(a["category"], a["rank"]) for a in e.also] == [("dist.peer_lost", 1)]


def test_terminal_wrapping_cuts_words_and_numbers() -> None:
    wrapped = "\n".join(OOM[i : i + 80] for i in range(0, len(OOM), 80))
    assert "GPU 0 ha\ns a total" in wrapped and "22.6\n1 GiB" in wrapped
    e = explain_text(wrapped)
    assert e.category == "oom.cuda" and e.line == 1
    assert (e.fields["total"], e.fields["free"]) == ("23.65 GiB", "1.03 GiB")
    assert e.fields["processes"] == "pid 2314: 22.61 GiB"
    # A message wrapped at spaces (a narrow paste) keeps its spaces.
    soft = OOM.replace("GPU 0 has a total ", "GPU 0 has a total\n")
    assert explain_text(soft).fields["total"] == "23.65 GiB"


def test_one_line_traceback_with_escaped_newlines() -> None:
    text = (
        '\'Traceback (most recent call last):\\n  File "t.py", line 3, in <module>\\n    '
        "loss.backward()\\nRuntimeError: element 0 of tensors does not require grad and does "
        "not have a grad_fn\\n'"
    )
    e = explain_text(text)
    assert e.category == "autograd.no_grad_fn"
    assert e.fields.get("code_line") == "loss.backward()"


def test_markdown_and_rich_boxes() -> None:
    quoted = "> `RuntimeError: CUDA error: invalid device ordinal`"
    assert explain_text(quoted).category == "cuda.invalid_device"
    boxed = (
        "│ ❱ 2267 │   return torch.embedding(weight, input, padding_idx, scale_grad_by_freq) │\n"
        "╰──────────────────────────────────────────────────────────────────────────────────╯\n"
        "IndexError: index out of range in self\n"
    )
    assert explain_text(boxed).category == "index.out_of_range"


def test_worker_prefixes_of_serving_logs() -> None:
    text = (
        "(VllmWorker rank=1 pid=2291) ERROR 06-24 10:00:01 [multiproc_executor.py:527] "
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB."
    )
    e = explain_text(text)
    assert e.category == "oom.cuda" and e.fields["asked"] == "1.00 GiB"


# --- facts -------------------------------------------------------------------------------


def test_facts_of_a_text() -> None:
    text = (
        'File "C:\\Users\\me\\train.py", line 3\n'
        "torch 2.5.1+cu121 on an NVIDIA GeForce RTX 5090 (sm_120)\n"
        "RuntimeError: expected mat1 and mat2 to have the same dtype, but got: c10::Half != "
        "c10::BFloat16 on cuda:0 and cuda:1\n"
        '  File "/x/site-packages/peft/tuners/lora.py", line 9\n'
    )
    f = facts.read(text)
    assert f["platform"] == "windows"
    assert f["torch_version"] == "2.5.1+cu121" and f["cuda_build"] == "cu121"
    assert f["gpu_names"] == ["RTX 5090"] and f["gpu_arch"] == "sm_120"
    assert set(f["dtypes"]) == {"float16", "bfloat16"}
    assert f["gpus_named"] == ["cuda:0", "cuda:1"] and facts.several_gpus(f)
    assert "peft" in f["packages"] and facts.blackwell(f)


def test_facts_decide_the_first_fix() -> None:
    two_gpus = explain_text(
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:1 and cuda:0!"
    )
    assert not two_gpus.causes[0].startswith("The model, or part of it, is still on the CPU")
    assert "CUDA_VISIBLE_DEVICES" in two_gpus.fixes[0]["code"]
    halves = explain_text(
        "RuntimeError: expected mat1 and mat2 to have the same dtype, but got: c10::Half != "
        "c10::BFloat16"
    )
    assert halves.fixes[0]["title"] == "One half-precision dtype throughout"
    assert "float64" not in halves.causes[0]
    unused = explain_text(
        "RuntimeError: Expected to have finished reduction in the prior iteration before "
        "starting a new one. This error indicates that your module has parameters that were "
        "not used in producing loss. You can enable unused parameter detection by passing the "
        "keyword argument `find_unused_parameters=True` to "
        "`torch.nn.parallel.DistributedDataParallel`"
    )
    assert "find_unused_parameters=True" in unused.fixes[0]["code"]


def test_a_fix_that_needs_an_unstated_fact_says_what_to_check() -> None:
    bare = explain_text(
        "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn"
    )
    fix = bare.fixes[0]
    assert "enable_input_require_grads" in fix["code"] and "gradient checkpointing" in fix["check"]
    stated = explain_text(
        '  File "/x/torch/utils/checkpoint.py", line 260, in forward\n'
        "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn"
    )
    assert "check" not in stated.fixes[0]


# --- how sure ----------------------------------------------------------------------------


def test_key_nouns_alone_are_said_with_low_confidence() -> None:
    e = explain_text("EOFError: Ran out of input")
    assert (e.category, e.confidence, e.confident) == ("ckpt.corrupt", "low", False)
    loaded = explain_text(
        '  File "/x/torch/serialization.py", line 1258, in _legacy_load\n'
        "    magic_number = pickle_module.load(f, **pickle_load_args)\n"
        "EOFError: Ran out of input"
    )
    assert loaded.confidence == "high"


def test_a_spawned_child_is_not_a_corrupt_checkpoint() -> None:
    # OFA-Sys/Chinese-CLIP#279: Windows, torchrun, no NCCL; the child's EOFError follows.
    text = (
        "RuntimeError: Distributed package doesn't have NCCL built in\n"
        "EOFError: Ran out of input\n"
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 "
        "(pid: 27316) of binary: C:\\anaconda\\envs\\clip\\python.exe\n"
    )
    e = explain_text(text)
    assert e.category == "dist.backend_unavailable"
    assert "gloo" in e.fixes[0]["title"].lower() or "gloo" in e.fixes[0]["code"]


def test_a_later_unknown_error_lowers_confidence() -> None:
    text = (
        "RuntimeError: CUDA error: device-side assert triggered\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "FrobnicatorError: the frobnicator broke\n"
    )
    e = explain_text(text)
    assert e.category == "cuda.device_assert" and e.confidence == "low"


def test_two_root_errors_of_different_kinds_lower_confidence() -> None:
    text = (
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 4x5)\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "RuntimeError: expected scalar type Float but found Double\n"
    )
    e = explain_text(text)
    assert e.category == "dtype.mismatch" and e.confidence == "low"
    assert [a["category"] for a in e.also] == ["shape.matmul"]


# --- distributed jobs: what ended them ---------------------------------------------------

GLOO_CLOSED = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by "
    "peer [18.25.6.30]:28048"
)
SIGKILLED = (
    "E0325 20:57:27.620000 2606 torch/distributed/elastic/multiprocessing/api.py:869] failed "
    "(exitcode: -9) local_rank: 5 (pid: 2630) of binary: /usr/bin/python\n"
)


def test_a_peer_lost_mid_training_is_a_peer_that_left() -> None:
    e = explain_text(GLOO_CLOSED)  # pytorch/pytorch#75512
    assert e.category == "dist.peer_lost"
    assert e.causes[0].startswith("The other rank died first")
    said = " ".join(f["title"] + f["code"] for f in e.fixes).lower()
    assert "every node can reach" not in said and "master_addr" not in said


def test_gloo_and_nccl_timeouts_are_apart() -> None:
    e = explain_text(
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
        "waiting 1800000ms for recv operation to complete"
    )
    assert e.category == "gloo.timeout" and e.fields["timeout"] == "30 min"
    assert not any("NCCL" in c for c in e.causes)
    nccl = explain_text(
        "[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
        "for 600040 milliseconds before timing out."
    )
    assert nccl.category == "nccl.timeout"


def test_the_launcher_stopped_from_outside() -> None:
    for text in (
        "W0101 12:00:00.000000 1 torch/distributed/elastic/agent/server/api.py:704] Received "
        "Signals.SIGTERM death signal, shutting down workers\n",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 2243 got "
        "signal: 15\n",
    ):
        e = explain_text(text)
        assert e.category == "dist.stopped", text
        assert "SIGTERM" in e.summary


def test_sigkill_is_killed_and_oom_only_with_memory_evidence() -> None:
    e = explain_text(SIGKILLED)
    assert e.category == "dist.killed" and "out of memory" not in e.summary.lower()
    assert e.causes[0].startswith("Host RAM may have run out")
    assert "dmesg" in e.fixes[0]["check"]
    dmesg = (
        "[Tue Mar  4 10:02:11 2025] Out of memory: Killed process 2630 (python) "
        "total-vm:98765432kB, anon-rss:81234567kB\n"
    )
    assert explain_text(dmesg + SIGKILLED).category == "oom.cpu"
