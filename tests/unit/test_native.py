"""torchdoctor's compiled module (torchdoctor/native): its build and load rules, its typed
boundary, the journal lines of both collectives kernels read back column by column on a real
1-rank gloo group in this process, sum_of_squares against torch; and the journal's reading back
of what another writer appends (store/journal.py: JournalTable.follow). The kernels' rows on
real torchrun jobs: tests/integration/test_collectives.py (every case with both kernels)."""

from __future__ import annotations

import inspect
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers import wait_for

from torchdoctor import native
from torchdoctor._failsafe import Switch
from torchdoctor.native import layout
from torchdoctor.store import journal
from torchdoctor.store.schema import COLLECTIVES
from torchdoctor.store.tables import Tables
from torchdoctor.telemetry import collectives, collectives_native
from torchdoctor.telemetry.c10d_ops import group_facts
from torchdoctor.telemetry.patches import Hooks


def test_make_test_built_the_kernel() -> None:
    assert native.built() is not None, "python -m torchdoctor.native"


def test_without_a_compiler_the_build_says_so(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TORCHDOCTOR_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++, c++ or clang++ on it
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(native.BuildError, match="no C\\+\\+ compiler"):
        native.build()
    assert native.built() is None


def test_a_library_others_may_write_is_not_loaded(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ours = native.built()
    assert ours is not None
    monkeypatch.setenv("TORCHDOCTOR_NATIVE_DIR", str(tmp_path / "cache"))
    target = native.library_path()
    target.parent.mkdir(parents=True, mode=0o700)
    shutil.copy(ours, target)
    assert native.built() == target
    target.parent.chmod(0o777)  # anyone could have put it there
    assert native.built() is None
    target.parent.chmod(0o700)
    target.chmod(0o666)
    assert native.built() is None


def test_the_cpp_kernel_where_built_unless_turned_off() -> None:
    code = "import torch, torchdoctor.native as n;print(n.load() is None)"
    assert native.built() is not None, "make test builds it: python -m torchdoctor.native"
    for setting, expected in (("0", "True"), ("", "False"), ("1", "False")):
        env = dict(os.environ, TORCHDOCTOR_NATIVE=setting)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.stdout.strip() == expected, out.stderr


def _row(rid: int, seq: int) -> bytes:
    return (
        f'I [{rid},0,"default",{seq},"all_reduce","[[4]]","float32",16,null,1.5,null,'
        f'"issued","train.py:9",0]\n'
    ).encode()


def test_a_followed_journal_is_read_back_line_by_line(tmp_path: Path) -> None:
    table = journal.JournalTable(COLLECTIVES)
    table.attach(lambda: tmp_path)
    closed: list[bool] = []
    path = table.follow(lambda: closed.append(True))
    assert path == journal.path_of(tmp_path, COLLECTIVES) and path.parent.is_dir()
    first = _row(0, 0)
    with open(path, "ab") as f:  # the other writer, half a line at a time
        f.write(first[:30])
        f.flush()
        table.catch_up()
        assert len(table) == 0  # a line not yet whole is not read
        f.write(first[30:] + _row(1, 1) + b'E [0,0.25,"completed"]\n')
        f.flush()
    by_seq = {r["seq"]: r for r in table.snapshot().to_records()}
    assert (by_seq[0]["state"], by_seq[0]["duration"]) == ("completed", 0.25)
    assert (by_seq[1]["state"], by_seq[1]["duration"]) == ("issued", None)
    table.close()
    assert closed == [True]
    # what the saved run reads is the same
    saved, truncated = journal.read(path, COLLECTIVES)
    assert not truncated and sorted(saved.column("seq")) == [0, 1]


# -- the typed boundary --------------------------------------------------------------------------


def test_the_modules_functions_are_the_protocols() -> None:
    # module.cpp lists the functions with their signatures; native.Kernels is what Python
    # expects of them: the same names, the same parameters
    kernels = native.load()
    assert kernels is not None
    declared = {
        name: inspect.signature(member)
        for name, member in vars(native.Kernels).items()
        if callable(member) and not name.startswith("_")
    }
    compiled = {name for name in dir(kernels) if not name.startswith("_")}
    assert compiled == set(declared)
    for name, expected in declared.items():
        params = list(expected.parameters.values())[1:]  # self
        got = list(inspect.signature(getattr(kernels, name)).parameters.values())
        assert [(p.name, p.kind) for p in got] == [(p.name, p.kind) for p in params], name


def test_the_layout_header_names_every_column_in_order() -> None:
    text = layout.header(COLLECTIVES)
    assert f"kColumns = {len(COLLECTIVES.columns)};" in text
    places = [text.index(f" {c.name}{{{i}}};") for i, c in enumerate(COLLECTIVES.columns)]
    assert places == sorted(places)
    assert "Int<true> peer{7};" in text and "Str<false> group{1};" in text
    assert f'kIssued[] = "{journal.ISSUED.decode()}"' in text
    assert layout.identifier("default") == "default_" and layout.identifier("seq") == "seq"
    with pytest.raises(ValueError):
        layout.identifier("two words")


# -- both kernels' lines, read back ----------------------------------------------------------


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    """This process as a 1-rank gloo job."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class Run:
    """The Recorder's side that collective tracing reads: the table, the step, the switch."""

    def __init__(self, directory: Path) -> None:
        self.tables = Tables()  # the process's tables, as the Recorder holds them
        self.tables.journal("collectives").attach(lambda: directory)
        self.step = 7
        self.rank = 0
        self.switch = Switch("telemetry")
        self.state = None


def _issue(call: Callable[[], Any]) -> str:
    """Make the call (a lambda on the caller's line); the site its row must name."""
    line = sys._getframe(1).f_lineno
    call()
    return f"{__file__}:{line}"


@pytest.mark.parametrize("kernel", ["native", "python"])
def test_each_kernels_journal_reads_back_column_by_column(
    world: None, kernel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kernel == "python":  # as where the module is not built
        monkeypatch.setenv("TORCHDOCTOR_NATIVE", "0")
        monkeypatch.setattr(native, "_loaded", [])
    run, hooks = Run(tmp_path), Hooks()
    table = run.tables["collectives"]
    installed = collectives.install(run, hooks)
    assert isinstance(installed, collectives_native.NativeCollectives) == (kernel == "native")
    default = dist.group.WORLD
    sub = dist.new_group([0])
    start = group_facts(default)[2]
    floats, halves = torch.arange(4.0), torch.ones(4, dtype=torch.bfloat16)
    gathered = [torch.empty(4)]
    before = time.time()
    try:
        sites = [
            _issue(lambda: dist.all_reduce(floats)),
            _issue(lambda: dist.broadcast(halves, src=0)),
        ]
        run.step = 8
        sites += [
            _issue(lambda: dist.all_gather(gathered, floats)),
            _issue(lambda: dist.barrier()),
            _issue(lambda: dist.all_reduce(floats, group=sub)),
        ]
        after = time.time()

        def ended() -> list[dict[str, Any]]:
            table.take_unspilled()  # what the spill thread's second does: poll, write, read
            rows = journal.read(journal.path_of(tmp_path, COLLECTIVES), COLLECTIVES)[0]
            records = rows.to_records()
            done = len(records) == 5 and all(r["state"] == "completed" for r in records)
            return records if done else []

        rows = sorted(wait_for(ended, 30, "every call ended"), key=lambda r: r["time"])
    finally:
        hooks.remove()
        table.close()
        if kernel == "native":  # none of them stays registered in this test process
            collectives_native.set_kernels(installed.kernels, False)
        dist.destroy_process_group(sub)
    sub_label = rows[-1]["group"]
    assert sub_label != "default" and sub_label.endswith(" [0]")
    expected = [
        (7, "default", start, "all_reduce", "[[4]]", "float32", 16, None),
        (7, "default", start + 1, "broadcast", "[[4]]", "bfloat16", 8, 0),
        (8, "default", start + 2, "all_gather", "[[4]]", "float32", 16, None),
        (8, "default", start + 3, "barrier", None, None, 0, None),
        (8, sub_label, rows[-1]["seq"], "all_reduce", "[[4]]", "float32", 16, None),
    ]
    fixed = ("step", "group", "seq", "op", "shapes", "dtype", "bytes", "peer")
    for row, values, site in zip(rows, expected, sites, strict=True):
        assert set(row) == set(COLLECTIVES.column_names)
        assert tuple(row[c] for c in fixed) == values
        assert (row["state"], row["site"], row["rank"]) == ("completed", site, 0)
        assert before <= row["time"] <= after
        if kernel == "native":  # gloo completes each future when the work is done
            assert 0 <= row["duration"] < 30
        else:  # seen completed by a poll: when is not known
            assert row["duration"] is None


# -- sum_of_squares ------------------------------------------------------------------------------


def _exact(tensors: list[torch.Tensor]) -> float:
    return float(sum(t.detach().double().pow(2).sum() for t in tensors))


def _torch(tensors: list[torch.Tensor]) -> float:
    flat = torch._C._nn.flatten_dense_tensors([t.float() for t in tensors])
    return float(torch.linalg.vector_norm(flat).item() ** 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_sum_of_squares_is_torchs_norm_squared(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    shapes: list[tuple[int, ...]] = [(), (1,), (7,), (8,), (9,), (3, 5), (64, 33), (2, 3, 4, 5)]
    tensors = [torch.randn(s, generator=generator).to(dtype) for s in shapes]
    tensors.append(torch.randn(40, generator=generator).to(dtype)[13:])  # an offset, contiguous
    tensors.append(torch.empty(0, dtype=dtype))
    got = native.sum_of_squares(tensors)
    assert got is not None
    assert math.isclose(got, _exact(tensors), rel_tol=1e-12)  # in double, in another order
    assert math.isclose(got, _torch(tensors), rel_tol=1e-5)
    for one in tensors:
        assert native.sum_of_squares([one]) == pytest.approx(_exact([one]), rel=1e-12, abs=0)
    assert native.sum_of_squares(tuple(tensors)) == got
    assert native.sum_of_squares([]) == 0.0
    parameter = torch.nn.Parameter(tensors[6].float())  # a Parameter is a tensor, not a subclass
    assert native.sum_of_squares([parameter]) == pytest.approx(_exact([parameter]), rel=1e-12)


def test_sum_of_squares_propagates_nan_and_inf_as_a_norm_does() -> None:
    inf, nan = math.inf, math.nan
    for values in ([1.0, inf], [-inf, 2.0], [nan, 1.0], [inf, nan], [nan, -inf]):
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            tensors = [torch.ones(5, dtype=dtype), torch.tensor(values).to(dtype)]
            got, norm = native.sum_of_squares(tensors), _torch(tensors)
            assert got is not None
            assert (math.isnan(got), math.isinf(got)) == (math.isnan(norm), math.isinf(norm))
    # Accumulated in double: float32 values whose norm passes float32's range stay finite
    # here, where torch's float32 norm says inf.
    big = [torch.full((2,), 3e38)]
    assert math.isinf(_torch(big)) and native.sum_of_squares(big) == pytest.approx(_exact(big))


class Subclass(torch.Tensor):
    pass


def test_sum_of_squares_leaves_what_it_cannot_read_to_torch() -> None:
    good = torch.ones(4)
    unreadable = [
        torch.ones(4, dtype=torch.int64),
        torch.ones(4, dtype=torch.bool),
        torch.ones(4, dtype=torch.complex64),
        torch.ones(4, 4).t(),  # not contiguous
        torch.ones(8)[::2],
        torch.ones(1).expand(4),
        torch.ones(4).to_sparse(),
        torch.ones(4, device="meta"),
        torch.ones(4).as_subclass(Subclass),
    ]
    for tensor in unreadable:
        assert native.sum_of_squares([good, tensor]) is None, tensor
    assert native.sum_of_squares([good, 1.0]) is None  # type: ignore[list-item]
    assert native.sum_of_squares(good) is None  # type: ignore[arg-type]  # a list of tensors
    assert native.sum_of_squares(iter([good])) is None  # type: ignore[arg-type]


def test_grad_squares_reads_the_parameters_gradients_as_sum_of_squares_does() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2))
    model(torch.randn(3, 5)).pow(2).sum().backward()
    params = list(model.parameters())
    grads = [p.grad for p in params]
    assert native.grad_squares(params, 1000) == (native.sum_of_squares(grads), 4)
    model[2].bias.grad = None  # a parameter without a gradient is left out and counted out
    squares = native.sum_of_squares([g for g in grads[:3]])
    assert native.grad_squares(params, 1000) == (squares, 3)
    assert native.grad_squares([], 10) == (0.0, 0)
    # More elements than the limit, a gradient it cannot read, a subclass: Python's way then
    assert native.grad_squares(params, 40) is None
    model[0].weight.grad = torch.ones(5, 7).t()  # not contiguous
    assert native.grad_squares(params, 1000) is None
    assert native.grad_squares([torch.ones(2).as_subclass(Subclass)], 10) is None


def test_a_dtensors_sum_of_squares_is_torchs(world: None) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    sharded = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
    assert native.sum_of_squares([sharded]) is None  # its local part need not be the whole


def test_without_the_module_sum_of_squares_leaves_it_to_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHDOCTOR_NATIVE", "0")  # as where it is not built
    monkeypatch.setattr(native, "_loaded", [])
    monkeypatch.delitem(vars(native), "sum_of_squares", raising=False)  # bound again
    assert native.load() is None
    assert native.sum_of_squares([torch.ones(3)]) is None
