"""The key comparison behind `torchdoctor ckpt --model`: remaps found from key names alone."""

from __future__ import annotations

from torchdoctor.checkpoint.keys import Remap, compare

MODEL = {
    "encoder.0.weight": (8, 4),
    "encoder.0.bias": (8,),
    "encoder.1.running_mean": (8,),
    "head.weight": (3, 8),
    "head.bias": (3,),
}


def test_exact_match_needs_no_remap() -> None:
    c = compare(MODEL, MODEL)
    assert c.remap.identity and c.loads_strictly and c.causes() == []


def test_ddp_around_a_compiled_model() -> None:
    ck = {f"module._orig_mod.{k}": v for k, v in MODEL.items()}
    c = compare(ck, MODEL)
    assert c.remap == Remap(drop=("_orig_mod", "module")) and c.fixable
    assert c.renamed == len(MODEL) and c.before["matched"] == 0
    said = " ".join(c.causes())
    assert "DistributedDataParallel" in said and "torch.compile" in said


def test_compiled_submodule() -> None:
    ck = {k.replace("encoder.", "encoder._orig_mod."): v for k, v in MODEL.items()}
    c = compare(ck, MODEL)
    assert c.remap.drop == ("_orig_mod",) and c.fixable


def test_prefix_replaced() -> None:
    ck = {f"net.{k}": v for k, v in MODEL.items()}
    model = {f"backbone.{k}": v for k, v in MODEL.items()}
    c = compare(ck, model)
    assert (c.remap.strip, c.remap.add) == ("net.", "backbone.") and c.fixable
    assert c.remap("net.head.bias") == "backbone.head.bias"


def test_missing_unexpected_and_shapes_are_told_apart() -> None:
    ck = dict(MODEL)
    del ck["encoder.1.running_mean"]
    ck["aux.weight"] = (2, 2)
    ck["encoder.0.weight"] = (16, 4)
    c = compare(ck, MODEL)
    assert c.missing == ["encoder.1.running_mean"] and c.unexpected == ["aux.weight"]
    assert [m["key"] for m in c.mismatched] == ["encoder.0.weight"] and not c.heads
    said = "\n".join(c.causes())
    assert "another shape (encoder.0.weight: checkpoint 16x4, model 8x4)" in said


def test_a_bare_layer_into_a_wrapper() -> None:
    c = compare({"weight": (3, 8), "bias": (3,)}, {"fc.weight": (3, 8), "fc.bias": (3,)})
    assert c.remap == Remap(add="fc.") and c.fixable
    assert "add the prefix 'fc.'" in c.causes()[0]


def test_head_needs_its_bias_to_change_too() -> None:
    ck = {**MODEL, "head.weight": (1000, 8), "head.bias": (1000,)}
    (head,) = compare(ck, MODEL).heads
    assert (head["checkpoint_classes"], head["model_classes"]) == (1000, 3)
