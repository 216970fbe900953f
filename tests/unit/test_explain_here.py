"""`torchdoctor explain --here`: the machine as evidence. Read on this machine (its torch, NumPy
and the files a text names), with a fake torchvision (a dist-info and a version.py in a temp
dir on sys.path) built for another torch, a fake nvidia-smi on PATH, and pure rules on machine
facts given as data (a driver too old for a cu128 build on an RTX 5090)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor import evidence, machine
from torchdoctor.errors import here
from torchdoctor.errors.api import explain_text

TORCH = importlib.metadata.version("torch")
LOAD_EMPTY = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 9, in <module>\n'
    '    state = torch.load("model.pt")\n'
    '  File "/usr/lib/python3/site-packages/torch/serialization.py", line 1040, in load\n'
    "    return _legacy_load(opened_file, map_location, pickle_module, **pickle_load_args)\n"
    "EOFError: Ran out of input\n"
)
NMS = "RuntimeError: operator torchvision::nms does not exist\n"


def test_versions_and_builds_of_this_machine() -> None:
    import numpy
    import torch

    found = machine.read(smi=False)
    assert found["versions"]["torch"] == TORCH == torch.__version__
    assert found["versions"]["numpy"] == numpy.__version__
    build = found["builds"]["torch"]
    assert build == (f"cuda {torch.version.cuda}" if torch.version.cuda else "cpu")
    ctx = here.context(found)
    assert ctx["torch_version"] == TORCH
    assert ctx["cuda_build"] == ("cpu" if build == "cpu" else ctx["cuda_build"])


def test_a_zero_byte_checkpoint_named_in_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"")
    # Without the machine: a likely category only ("Ran out of input" is also what a spawned
    # child reads when its parent died), with every cause of a corrupt file.
    plain = explain_text("EOFError: Ran out of input")
    assert plain.category == "ckpt.corrupt" and plain.confidence == "low"
    e = evidence.explain_here(LOAD_EMPTY, base=tmp_path, smi=False)
    assert (e.category, e.confidence) == ("ckpt.corrupt", "high")
    assert any("model.pt here is 0 bytes" in said for said in e.evidence), e.evidence
    assert e.causes[0].startswith("model.pt is empty (0 bytes)")
    assert not any("Git LFS" in c for c in e.causes)  # ruled out: an empty file is no pointer
    # The key nouns alone, confirmed by the file: certain too.
    bare = evidence.explain_here(
        'EOFError: Ran out of input  (torch.load("model.pt"))', base=tmp_path, smi=False
    )
    assert bare.confidence == "high" and bare.causes[0].startswith("model.pt is empty")


def test_a_file_that_is_not_here(tmp_path: Path) -> None:
    e = evidence.explain_here(LOAD_EMPTY, base=tmp_path, smi=False)
    assert any(said.startswith("model.pt is not at") for said in e.evidence)


def _fake_torchvision(site: Path, torch_pin: str, cuda: str = "12.4") -> None:
    info = site / "torchvision-0.20.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.20.1+cu124\n"
        f"Requires-Dist: numpy\nRequires-Dist: torch =={torch_pin}\n"
    )
    package = site / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "version.py").write_text(f"__version__ = '0.20.1+cu124'\ncuda = '{cuda}'\n")


def test_torchvision_built_for_another_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_torchvision(tmp_path, "2.5.1")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    found = machine.read(smi=False)
    assert found["versions"]["torchvision"] == "0.20.1+cu124"
    assert found["built_for_torch"]["torchvision"] == {"torch": "2.5.1", "from": "metadata"}
    assert found["builds"]["torchvision"] == "cuda 12.4"
    e = evidence.explain_here(NMS, base=tmp_path, smi=False)
    assert e.category == "install.mismatch"
    said = " ".join(e.evidence)
    assert "torchvision 0.20.1+cu124 here was built for torch 2.5.1" in said
    assert f"torch {TORCH} is installed" in said
    assert e.causes[0].startswith("torchvision does not match torch")
    assert e.fixes[0]["title"].startswith("Install torch and torchvision together")


def test_a_torchvision_that_fits_is_ruled_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    cuda = torch.version.cuda
    _fake_torchvision(tmp_path, TORCH.split("+")[0], cuda or "")
    if not cuda:  # a CPU torch: a CPU torchvision
        (tmp_path / "torchvision" / "version.py").write_text(
            "__version__ = '0.20.1'\ncuda = None\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    e = evidence.explain_here(NMS, base=tmp_path, smi=False)
    assert any("the pair fits" in said for said in e.evidence), e.evidence
    assert not e.causes[0].startswith("torchvision does not match torch")


def test_nvidia_smi_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=*) echo '0, NVIDIA GeForce RTX 5090, 560.35.03, 32607, 12.0'\n"
        "                 echo '1, NVIDIA GeForce RTX 5090, 560.35.03, 32607, 12.0' ;;\n"
        "  *) echo 'NVIDIA-SMI 560.35.03  Driver Version: 560.35.03  CUDA Version: 12.6' ;;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    found = machine.gpus()
    assert found["smi"] == "ok" and found["driver"] == "560.35.03"
    assert found["driver_cuda"] == "12.6"
    assert [g["arch"] for g in found["gpus"]] == ["sm_120", "sm_120"]
    assert found["gpus"][0]["memory_mib"] == 32607


def _rtx5090(build: str, driver_cuda: str) -> dict:
    return {
        "versions": {"torch": f"2.8.0+{build}"},
        "builds": {"torch": f"cuda {build[2:-1]}.{build[-1]}"},
        "smi": "ok",
        "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 5090", "arch": "sm_120"}],
        "driver": "560.35.03",
        "driver_cuda": driver_cuda,
        "files": {},
    }


NO_KERNEL = "RuntimeError: CUDA error: no kernel image is available for execution on the device"


def test_a_cu128_build_with_a_driver_too_old() -> None:
    # pytorch/pytorch#149845: the cu128 build was already installed; the driver was too old.
    e = explain_text(NO_KERNEL, machine=_rtx5090("cu128", "12.6"))
    assert e.causes[0].startswith("The driver (560.35.03, up to CUDA 12.6) is older")
    assert e.fixes[0]["title"].startswith("Update the NVIDIA driver")
    said = " ".join(e.evidence)
    assert "supports up to CUDA 12.6, older than the CUDA 12.8" in said
    assert "which includes it" in said  # the build covers sm_120: the wheel is ruled out
    # The text alone cannot tell: the build that supports the GPU comes first, and the driver
    # fix says what to check.
    plain = explain_text(NO_KERNEL)
    assert plain.fixes[0]["title"].startswith("Install a build that supports the GPU")
    driver = next(f for f in plain.fixes if f["title"].startswith("Update the NVIDIA driver"))
    assert "nvidia-smi" in driver["check"]


def test_an_old_build_on_a_new_gpu() -> None:
    e = explain_text(NO_KERNEL, machine=_rtx5090("cu126", "12.8"))
    assert e.causes[0].startswith("The installed wheel does not include this GPU")
    assert any("only CUDA 12.8+ builds support" in said for said in e.evidence)


def test_cpu_build_on_this_machine() -> None:
    import torch

    e = evidence.explain_here("AssertionError: Torch not compiled with CUDA enabled", smi=False)
    assert e.category == "cuda.not_available"
    if torch.version.cuda is None:
        assert any("is a CPU-only build" in said for said in e.evidence)
        assert e.causes[0].startswith("A CPU-only build")
    else:
        assert any("is a CUDA build" in said for said in e.evidence)
        assert not e.causes[0].startswith("A CPU-only build")


def test_a_checkpoint_saved_from_ddp(tmp_path: Path) -> None:
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(2, 3))
    torch.save(
        {"model": {f"module.{k}": v for k, v in model.state_dict().items()}}, tmp_path / "ddp.pt"
    )
    summary = evidence.checkpoint(tmp_path / "ddp.pt")
    assert summary["wrapper"] == "module." and summary["state_dict"] == "model"
    assert summary["prefixes"] == ["0"] and summary["tensors"] == 2
    # No prefix in the message to go by (the old single-key wording names an unprefixed key):
    # the file says it.
    text = (
        'File "eval.py", line 4, in <module>\n    model.load_state_dict(torch.load("ddp.pt"))\n'
        'KeyError: unexpected key "0.weight" in state_dict'
    )
    e = explain_text(
        text.replace("KeyError: ", ""), machine=evidence.gather(text, base=tmp_path, smi=False)
    )
    assert e.category == "ckpt.keys"
    assert any("every key starts with 'module.'" in said for said in e.evidence)
    assert "DistributedDataParallel" in e.causes[0]


def test_model_families_from_keys() -> None:
    assert evidence.family(["layer1.0.conv1.weight", "fc.weight"]) == "ResNet"
    assert evidence.family(["model.layers.0.self_attn.q_proj.weight"]).startswith("Llama")
    assert evidence.family(["base_model.model.layers.0.self_attn.q_proj.lora_A.weight"]).startswith(
        "LoRA"
    )
    assert evidence.family(["weird.thing"]) is None


def test_requirements_pins_against_the_installed_versions(tmp_path: Path) -> None:
    # mark1879/Baichuan-13B-Finetuning#21: the script was written for another peft.
    pins = "numpy==1.26.4\ntransformers==4.30.0\ntorch>=1.0  # any\n"
    (tmp_path / "requirements.txt").write_text(pins)
    found = machine.read(base=tmp_path, smi=False)
    assert found["requirements"]["numpy"] == {"spec": "==1.26.4", "file": "requirements.txt"}
    text = "ValueError: Attempting to unscale FP16 gradients."
    assert not explain_text(text).fixes[0]["title"].startswith("Use the library versions")
    e = explain_text(text, machine=found)
    said = " ".join(e.evidence)
    assert "numpy" not in said  # a pin the installed NumPy breaks, but no cause of this error
    assert "requirements.txt pins transformers==4.30.0" in said
    assert "pins torch" not in said  # torch>=1.0 holds
    assert e.causes[0].startswith("The project pins transformers==4.30.0 but transformers")
    assert e.fixes[0]["title"].startswith("Use the library versions")


def _cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torchdoctor", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def test_cli_here_on_a_file_and_on_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "model.pt").write_bytes(b"")
    (tmp_path / "err.txt").write_text(LOAD_EMPTY)
    out = _cli("explain", "err.txt", "--here", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "On this machine" in out.stdout and "model.pt here is 0 bytes" in out.stdout
    plain = _cli("explain", "err.txt", cwd=tmp_path)
    assert "On this machine" not in plain.stdout
    # A run directory recorded on this host: the machine is evidence by default.
    run = tmp_path / "run"
    run.mkdir()
    meta = {"host": socket.gethostname(), "cwd": str(tmp_path), "status": "exited"}
    (run / "meta.json").write_text(json.dumps(meta))
    crash = {
        "kind": "crash",
        "evidence": {
            "exception": "EOFError",
            "message": "Ran out of input (torch.load('model.pt'))",
        },
    }
    (run / "diagnoses.jsonl").write_text(json.dumps(crash) + "\n")
    out = _cli("explain", str(run), "--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["category"] == "ckpt.corrupt" and data["confidence"] == "high"
    assert any("0 bytes" in said for said in data["evidence"])
    off = json.loads(
        _cli("explain", str(run), "--no-here", "--format", "json", cwd=tmp_path).stdout
    )
    assert off["evidence"] == [] and off["confidence"] == "low"
    # Another host's run: the text only.
    meta["host"] = "elsewhere"
    (run / "meta.json").write_text(json.dumps(meta))
    other = json.loads(_cli("explain", str(run), "--format", "json", cwd=tmp_path).stdout)
    assert other["evidence"] == []


def test_an_exception_of_this_process_is_explained_here(tmp_path: Path) -> None:
    # torch >= 2.6 reads an empty file with its weights_only unpickler: a bare EOFError that
    # names no file; the torch.load frame in the traceback holds the path.
    import torch

    import torchdoctor

    path = tmp_path / "empty.pt"
    path.write_bytes(b"")
    try:
        torch.load(str(path))
    except Exception as exc:
        caught = exc
    e = torchdoctor.explain(caught)
    assert (e.category, e.confidence) == ("ckpt.corrupt", "high")
    assert any("empty.pt here is 0 bytes" in said for said in e.evidence), e.evidence
    assert "On this machine" in str(e)
    text = torchdoctor.explain("EOFError: Ran out of input")  # a text: not here by default
    assert text.evidence == [] and "probably" in str(text)
    assert torchdoctor.explain(caught, here=False).evidence == []


def test_the_report_says_what_to_check() -> None:
    from torchdoctor.report.explanation import render_text

    e = explain_text(NO_KERNEL)
    out = render_text(e)
    assert "(check first: Compare the 'CUDA Version' in nvidia-smi's header" in out
