"""`torchdoctor ckpt`: real checkpoints written by torch.save (DataParallel, torch.compile, a
wrapper, another head, a whole pickled model, a CUDA run), and the fixed versions it writes,
checked by loading them into the model with strict=True. Files that are not checkpoints,
and a malicious one, must be refused without running anything.

Most runs go through the CLI's entry point in this process (the same code as the command);
two run the command in a subprocess for the exit code and JSON end to end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import SCRIPTS, cli
from recording import execute

from torchdoctor.cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ckpt"
MODELS = SCRIPTS / "ckpt_models.py"


def _models() -> Any:
    spec = importlib.util.spec_from_file_location("ckpt_models_for_tests", MODELS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


models = _models()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["ckpt", *[str(a) for a in args]])
    out = capsys.readouterr()
    return code, out.out, out.err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run(capsys, *args, "--format", "json")
    assert out, err
    return code, json.loads(out)


def model(name: str) -> str:
    return f"{MODELS}:{name}"


def strict_load(path: Path, net: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    net.load_state_dict(state, strict=True)  # raises when it does not fit
    return dict(state)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def trained() -> torch.nn.Module:
    torch.manual_seed(0)
    net = models.Net()
    net.features[1].running_mean.add_(0.5)  # a buffer that differs from a fresh model's
    return net


def test_cuda_checkpoint_on_a_cpu_machine(capsys: pytest.CaptureFixture[str]) -> None:
    # Written on an H100 by tests/scripts/make_cuda_checkpoint.py; read here without CUDA.
    for name, fmt in (("cuda_saved.pt", "zip"), ("cuda_saved_legacy.pt", "legacy")):
        code, data = run_json(capsys, FIXTURES / name)
        assert code == 0 and data["status"] == "ok" and data["format"] == fmt
        assert data["devices"]["cuda:0"] == {"tensors": 12, "bytes": 804}
        assert data["devices"]["cpu"]["tensors"] == 4  # Adam's step counters
        assert data["tensors"] == 16 and data["dtypes"] == {
            "float32": {"tensors": 16, "bytes": 820}
        }
        assert [s["path"] for s in data["state_dicts"]] == ["model"]
        names = [c["name"] for c in data["structure"]["children"]]
        assert names == ["model", "optimizer", "epoch"]
        assert data["structure"]["children"][2]["value"] == 3
    code, text, _ = run(capsys, FIXTURES / "cuda_saved.pt", "--model", model("mlp"))
    assert code == 0, text
    assert "saved from: cuda:0 (12 tensors" in text and "map_location='cpu'" in text
    assert "reading checkpoint['model']" in text and "loads with strict=True: yes" in text


def test_dataparallel_prefix_and_its_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trained: torch.nn.Module
) -> None:
    torch.save(torch.nn.DataParallel(trained).state_dict(), tmp_path / "ddp.pt")
    code, data = run_json(capsys, tmp_path / "ddp.pt", "--model", model("net"))
    assert code == 1 and data["status"] == "mismatch"
    m = data["model"]
    assert m["remap"] == {"drop": ["module"], "strip": "", "add": ""}
    assert "DistributedDataParallel" in m["causes"][0] and m["fixable_by_renaming"]
    assert m["before_remap"]["matched"] == 0 and m["matched"] == len(trained.state_dict())
    assert "module" in m["code"] and "strict=True" in m["code"]
    # The code it suggests does the repair too.
    sd = torch.load(tmp_path / "ddp.pt", weights_only=True)
    sd = {".".join(p for p in k.split(".") if p not in ("module",)): v for k, v in sd.items()}
    models.Net().load_state_dict(sd, strict=True)

    code, text, _ = run(
        capsys, tmp_path / "ddp.pt", "--model", model("net"), "--fix", tmp_path / "fixed.pt"
    )
    assert code == 0, text
    assert "loads with strict=True: yes" in text
    assert same(strict_load(tmp_path / "fixed.pt", models.Net()), trained.state_dict())
    code, data = run_json(capsys, tmp_path / "fixed.pt", "--model", model("net"))
    assert code == 0 and data["model"]["loads_strictly"]


def test_compiled_model_in_a_training_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trained: torch.nn.Module
) -> None:
    compiled = torch.compile(trained)  # state_dict() of the wrapper: keys start _orig_mod.
    torch.save({"model": compiled.state_dict(), "epoch": 7}, tmp_path / "c.pt")
    code, data = run_json(
        capsys, tmp_path / "c.pt", "--model", model("net"), "--fix", tmp_path / "f.pt"
    )
    assert code == 0 and data["status"] == "fixed", data["fix"]
    m = data["model"]
    assert m["state_dict"] == "model" and m["remap"]["drop"] == ["_orig_mod"]
    assert "torch.compile" in m["causes"][0]
    assert "['model']" in m["code"]
    assert data["fix"]["renamed"] == len(trained.state_dict()) and not data["fix"]["from_model"]
    assert same(strict_load(tmp_path / "f.pt", models.Net()), trained.state_dict())


def test_wrapper_prefix_both_ways(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trained: torch.nn.Module
) -> None:
    wrapper = models.Wrapper()
    wrapper.model = trained
    torch.save(wrapper.state_dict(), tmp_path / "wrapped.pt")
    code, data = run_json(capsys, tmp_path / "wrapped.pt", "--model", model("net"))
    assert code == 1 and data["model"]["remap"] == {"drop": [], "strip": "model.", "add": ""}
    assert "wrapper" in data["model"]["causes"][0]
    # The other way: a bare network's weights into the wrapper.
    torch.save(trained.state_dict(), tmp_path / "bare.pt")
    code, data = run_json(
        capsys, tmp_path / "bare.pt", "--model", model("wrapped"), "--fix", tmp_path / "w.pt"
    )
    assert code == 0 and data["model"]["remap"]["add"] == "model."
    fixed = strict_load(tmp_path / "w.pt", models.Wrapper())
    assert torch.equal(fixed["model.head.weight"], trained.head.weight)


def test_head_with_another_number_of_classes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    torch.manual_seed(1)
    pretrained = models.Net(1000)
    torch.save({"state_dict": pretrained.state_dict()}, tmp_path / "imagenet.pt")
    code, data = run_json(capsys, tmp_path / "imagenet.pt", "--model", model("net"))
    assert code == 1
    m = data["model"]
    assert m["heads"] == [
        {
            "module": "head",
            "checkpoint_classes": 1000,
            "model_classes": 10,
            "keys": ["head.weight", "head.bias"],
        }
    ]
    assert not m["fixable_by_renaming"] and "strict=False" in m["code"]
    code, data = run_json(
        capsys, tmp_path / "imagenet.pt", "--model", model("net"), "--fix", tmp_path / "ft.pt"
    )
    assert code == 0, data["fix"]
    assert data["fix"]["from_model"] == ["head.weight", "head.bias"]
    fixed = strict_load(tmp_path / "ft.pt", models.Net())
    assert torch.equal(fixed["features.0.weight"], pretrained.features[0].weight)
    assert fixed["head.weight"].shape == (10, 32)


def test_checkpoint_of_another_model_is_not_fixed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trained: torch.nn.Module
) -> None:
    torch.save(trained.state_dict(), tmp_path / "net.pt")
    code, data = run_json(
        capsys, tmp_path / "net.pt", "--model", model("other"), "--fix", tmp_path / "no.pt"
    )
    assert code == 1 and data["status"] == "not_fixed"
    assert "belongs to another model" in data["fix"]["error"]
    assert not (tmp_path / "no.pt").exists()


def test_whole_pickled_model_is_refused_and_its_weights_rescued(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    whole, state = tmp_path / "whole.pt", tmp_path / "state.pt"
    # its class in __main__, as a script defines it: run as a script, in this process
    saved = execute("ckpt_save_whole_model.py", str(whole), str(state), cwd=tmp_path)
    assert saved.code == 0, saved.output()
    code, data = run_json(capsys, whole)
    assert code == 1 and data["status"] == "needs_code" and not data["loads_weights_only"]
    needed = {n["global"]: n["why"] for n in data["needs_code"]}
    assert "__main__.TinyNet" in needed and "whole nn.Module" in needed["__main__.TinyNet"]
    assert "TinyNet" in data["torch_says"]
    assert data["state_dicts"][0]["from_module_object"]
    # The non-persistent buffer is not part of the state dict, as in state_dict().
    assert "scratch" not in data["state_dicts"][0]["keys"]

    code, text, _ = run(capsys, whole, "--model", model("net"), "--fix", tmp_path / "rescued.pt")
    assert code == 0, text
    original = torch.load(state, weights_only=True)
    assert same(strict_load(tmp_path / "rescued.pt", models.Net()), original)
    # Without a model: the state dict alone.
    code, data = run_json(capsys, whole, "--fix", tmp_path / "alone.pt")
    assert code == 0 and data["fix"]["tensors"] == len(original)
    assert same(torch.load(tmp_path / "alone.pt", weights_only=True), original)


def test_malicious_pickle_never_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {marker}",))

    torch.save({"weight": torch.ones(2), "payload": Payload()}, tmp_path / "evil.pt")
    code, data = run_json(capsys, tmp_path / "evil.pt", "--model", model("net"))
    assert not marker.exists()
    assert data["status"] == "needs_code" and code == 1
    (danger,) = [n for n in data["needs_code"] if n["global"].endswith(".system")]
    assert "malicious" in danger["why"]
    code, _text, _ = run(capsys, tmp_path / "evil.pt", "--fix", tmp_path / "x.pt")
    assert not marker.exists()


def test_plain_tensor_nested_containers_and_key_choice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trained: torch.nn.Module
) -> None:
    torch.save(torch.randn(3, 4), tmp_path / "t.pt")
    code, data = run_json(capsys, tmp_path / "t.pt")
    assert code == 0 and data["structure"]["type"] == "tensor"
    assert data["structure"]["shape"] == [3, 4] and data["state_dicts"] == []
    code, out, _ = run(capsys, tmp_path / "t.pt", "--model", model("net"))
    assert code == 1 and "holds no state dict" in out

    torch.save(
        [{"a": torch.ones(2)}, [torch.zeros(3, dtype=torch.int64), 3, "x"]], tmp_path / "n.pt"
    )
    code, data = run_json(capsys, tmp_path / "n.pt")
    assert code == 0 and data["dtypes"].keys() == {"float32", "int64"}
    second = data["structure"]["children"][1]
    assert [c.get("value") for c in second["children"][1:]] == [3, "x"]

    ema = models.Net()
    torch.save(
        {"model": models.Net(1000).state_dict(), "ema": trained.state_dict()}, tmp_path / "e.pt"
    )
    code, data = run_json(capsys, tmp_path / "e.pt", "--model", model("net"))
    assert code == 0 and data["model"]["state_dict"] == "ema"  # the best fit
    code, data = run_json(capsys, tmp_path / "e.pt", "--model", model("net"), "--key", "model")
    assert code == 1 and data["model"]["heads"]
    del ema


def test_safetensors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trained: torch.nn.Module
) -> None:
    from safetensors.torch import load_file, save_file

    state = {f"module.{k}": v.contiguous() for k, v in trained.state_dict().items()}
    save_file(state, str(tmp_path / "w.safetensors"), metadata={"step": "100"})
    code, data = run_json(
        capsys,
        tmp_path / "w.safetensors",
        "--model",
        model("net"),
        "--fix",
        tmp_path / "f.safetensors",
    )
    assert data["format"] == "safetensors" and data["loads_weights_only"]
    assert data["metadata"] == {"metadata": {"step": "100"}}
    assert data["devices"] == {"(not recorded)": {"tensors": 9, "bytes": data["bytes"]}}
    assert code == 0 and data["model"]["remap"]["drop"] == ["module"]
    fixed = load_file(str(tmp_path / "f.safetensors"))
    models.Net().load_state_dict(fixed, strict=True)
    assert same(fixed, trained.state_dict())
    raw = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[: len(raw) - 100])
    code, out, _ = run(capsys, tmp_path / "cut.safetensors")
    assert code == 1 and "cut short" in out


def test_files_that_are_not_checkpoints(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.randn(64, 64)}, good)
    data = good.read_bytes()
    cases = {
        "empty.pt": (b"", "empty"),
        "page.pt": (b"<!DOCTYPE html><html><body>Sign in</body></html>", "HTML page"),
        "lfs.pt": (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n", "LFS"),
        "cut.pt": (data[: len(data) // 2], "cut short"),
        "plain.pkl": (pickle.dumps({"a": 1}, protocol=2), "plain pickle"),
        "noise.bin": (bytes(range(256)) * 4, "not a checkpoint"),
    }
    for name, (content, said) in cases.items():
        (tmp_path / name).write_bytes(content)
        code, out, _ = run(capsys, tmp_path / name)
        assert code == 1 and said in out, (name, out)
    code, data_ = run_json(capsys, tmp_path / "cut.pt")
    assert code == 1 and data_["status"] == "corrupt"
    code, _out, err = run(capsys, tmp_path / "missing.pt")
    assert code == 2 and "no such file" in err
    code, _out, err = run(capsys, tmp_path)
    assert code == 2 and "directory" in err
    for spec, said in (
        ("nope.py:net", "no such file"),
        (f"{MODELS}:missing", "has no 'missing'"),
        (f"{MODELS}:broken", "config/model.yaml not found"),
        (f"{MODELS}:not_a_module", "not an nn.Module"),
        (str(MODELS), "PATH.py:FACTORY"),
    ):
        code, _out, err = run(capsys, good, "--model", spec)
        assert code == 2 and said in err, (spec, err)


def test_command_end_to_end(tmp_path: Path, trained: torch.nn.Module) -> None:
    torch.save(torch.nn.DataParallel(trained).state_dict(), tmp_path / "ddp.pt")
    out = cli("ckpt", str(tmp_path / "ddp.pt"), "--model", model("net"), "--format", "json")
    assert out.returncode == 1, out.stderr
    assert json.loads(out.stdout)["model"]["remap"]["drop"] == ["module"]
    out = cli("ckpt", str(FIXTURES / "cuda_saved.pt"))
    assert out.returncode == 0 and "saved from: cuda:0" in out.stdout
