"""Every command of the live-debugging playbook torchdoctor was built from (the examples of a
probe driven by backtrace, query over python.backtrace / python.torch_trace, and eval; they
are listed below), verbatim, with the other tool's name replaced by `torchdoctor` and
$ENDPOINT by the pid (or HOST:PORT for -t)."""

from __future__ import annotations

import stat

import pytest
from helpers import free_port, script, td_run

# (arguments after `torchdoctor ENDPOINT`, text the output must contain)
SEED_COMMANDS: list[tuple[list[str], str]] = [
    (["backtrace"], "trainer.py"),
    (
        [
            "query",
            "\nSELECT func, file, lineno, depth\nFROM python.backtrace\nORDER BY depth\nLIMIT 10",
        ],
        "depth",
    ),
    (
        [
            "eval",
            "\nimport threading\nfor t in threading.enumerate():\n"
            "    print(f'{t.name}: alive={t.is_alive()}')",
        ],
        "MainThread: alive=True",
    ),
    (
        [
            "eval",
            "\nimport torch.utils.data\nprint(f'DataLoader workers: {train_loader.num_workers}')\n"
            "print(f'Prefetch factor: {train_loader.prefetch_factor}')",
        ],
        "DataLoader workers: 0",
    ),
    (
        [
            "eval",
            "\nimport torch.distributed as dist\nif dist.is_initialized():\n"
            "    print(f'Rank: {dist.get_rank()}')\n    print(f'Waiting for barrier...')\n"
            "    # Don't actually call barrier here!",
        ],
        "",
    ),
    (
        [
            "eval",
            "\nimport torch\nfor name, param in model.named_parameters():\n"
            "    if param.grad is not None:\n"
            "        has_nan = torch.isnan(param.grad).any().item()\n"
            "        has_inf = torch.isinf(param.grad).any().item()\n"
            "        if has_nan or has_inf:\n"
            "            print(f'{name}: NaN={has_nan}, Inf={has_inf}')",
        ],
        "",
    ),
    (["eval", "\nprint(f'Grad clip value: {getattr(trainer, \"grad_clip\", None)}')"], "1.0"),
    (["eval", "\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)"], ""),
    (
        [
            "query",
            "\nSELECT\n    module,\n    stage,\n    COUNT(*) as count,\n"
            "    AVG(duration) as avg_time,\n    SUM(duration) as total_time\n"
            "FROM python.torch_trace\nWHERE step > (SELECT MAX(step) - 5 FROM python.torch_trace)\n"
            "GROUP BY module, stage\nORDER BY total_time DESC\nLIMIT 10",
        ],
        "forward",
    ),
    (
        [
            "eval",
            "\nimport subprocess\n"
            "result = subprocess.run(['nvidia-smi', '--query-gpu=utilization.gpu', "
            "'--format=csv,noheader'],\n                        capture_output=True, text=True)\n"
            "print(f'GPU Utilization: {result.stdout.strip()}')",
        ],
        "GPU Utilization: 42 %",
    ),
    (
        [
            "query",
            "\nSELECT\n    step,\n    MAX(allocated) as peak_memory,\n"
            "    MAX(allocated) - MIN(allocated) as memory_range\nFROM python.torch_trace\n"
            "WHERE step > (SELECT MAX(step) - 20 FROM python.torch_trace)\n"
            "GROUP BY step\nORDER BY step",
        ],
        "peak_memory",
    ),
    (
        [
            "eval",
            "\nimport gc\nimport torch\n\n# Clear gradients\nmodel.zero_grad(set_to_none=True)\n\n"
            "# Garbage collection\ngc.collect()\n\n# Clear CUDA cache\n"
            "if torch.cuda.is_available():\n    torch.cuda.empty_cache()\n\n"
            "print('Cleanup complete')",
        ],
        "Cleanup complete",
    ),
    (
        [
            "eval",
            "\nimport torch\ncheckpoint = {\n    'step': trainer.current_step,\n"
            "    'model': model.state_dict(),\n    'optimizer': optimizer.state_dict(),\n}\n"
            "torch.save(checkpoint, 'emergency_checkpoint.pt')\n"
            "print('Emergency checkpoint saved')",
        ],
        "Emergency checkpoint saved",
    ),
    (
        [
            "eval",
            "\nimport torch\nckpt = torch.load('checkpoint.pt', map_location='cpu')\n"
            "print(f'Keys: {ckpt.keys()}')\nprint(f'Step: {ckpt.get(\"step\", \"N/A\")}')",
        ],
        "Keys: dict_keys(['step', 'model', 'optimizer'])",
    ),
    (
        [
            "eval",
            "\nfor i, pg in enumerate(optimizer.param_groups):\n"
            '    print(f\'Group {i}: lr={pg["lr"]}, weight_decay={pg.get("weight_decay", 0)}\')',
        ],
        "Group 0: lr=0.05, weight_decay=0",
    ),
    (
        [
            "eval",
            "\nfor pg in optimizer.param_groups:\n    pg['lr'] *= 0.1\n"
            "print(f'New LR: {optimizer.param_groups[0][\"lr\"]}')",
        ],
        "New LR: 0.005",
    ),
    (
        [
            "eval",
            "\nimport torch.distributed as dist\nif dist.is_initialized():\n"
            "    tensor = torch.tensor([trainer.current_step], device='cuda')\n"
            "    dist.all_reduce(tensor)\n"
            "    print(f'Sum of steps across ranks: {tensor.item()}')",
        ],
        "",
    ),
]


@pytest.fixture(scope="module")
def seeded(shared_launch, tmp_path_factory):
    """One live trainer.py that every test here questions (the commands leave it training)."""
    tmp_path = tmp_path_factory.mktemp("seeded")
    # A stand-in nvidia-smi on PATH, so the GPU-utilisation command runs verbatim here.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '42 %'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    import os

    port = free_port()
    run = shared_launch(
        # --pause 0.02: a few dozen steps a second are all the commands need
        td_run(
            "--trace-every",
            "2",
            "--listen",
            f"127.0.0.1:{port}",
            script("trainer.py"),
            "--pause",
            "0.02",
        ),
        extra_env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
        cwd=tmp_path / "work",
    )
    run.wait_probe()
    run.wait_steps(8)
    run.port = port
    yield run
    run.stop()


def test_every_seed_command_works_verbatim(seeded) -> None:
    run = seeded
    for args, expected in SEED_COMMANDS:
        if args == SEED_COMMANDS[13][0]:  # "Inspect Checkpoint" loads the file saved before
            (run.cwd / "emergency_checkpoint.pt").rename(run.cwd / "checkpoint.pt")
        out = run.cli(str(run.pid), *args)
        assert out.returncode == 0, (args, out.stderr)
        assert expected in out.stdout, (args, out.stdout)
    # The training survived all of it, at a tenth of its learning rate.
    lr = run.query("SELECT lr FROM python.steps ORDER BY step DESC LIMIT 1")[0]["lr"]
    before = run.steps()
    run.wait_steps(before + 2)
    assert lr == pytest.approx(0.005) or run.query(
        "SELECT lr FROM python.steps ORDER BY step DESC LIMIT 1"
    )[0]["lr"] == pytest.approx(0.005)


def test_slow_training_query_names_real_modules(seeded) -> None:
    rows = seeded.query(
        "SELECT module, stage, COUNT(*) as count, SUM(duration) as total_time "
        "FROM python.torch_trace WHERE step > (SELECT MAX(step) - 5 FROM python.torch_trace) "
        "GROUP BY module, stage ORDER BY total_time DESC"
    )
    modules = {r["module"] for r in rows}
    assert {"model", "model.0", "model.1", "model.2"} <= modules, modules  # a Sequential
    assert {r["stage"] for r in rows} == {"forward", "backward"}


def test_target_flag_over_tcp(seeded, env) -> None:
    run = seeded
    target = f"127.0.0.1:{run.port}"
    # Rank-check commands of the playbook, with node1:8080 as this machine's port. The token is
    # found in the run directory (same user, same machine)...
    out = run.cli("-t", target, "eval", "print(f'Rank 0 step: {trainer.current_step}')")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Rank 0 step: ")
    # ...or given explicitly, and a wrong one is refused.
    token = (run.run_dirs()[0] / "token").read_text()
    assert oct((run.run_dirs()[0] / "token").stat().st_mode & 0o777) == "0o600"
    out = run.cli("-t", target, "--token", token, "query", "SELECT 1 AS one")
    assert out.returncode == 0 and "one" in out.stdout
    out = run.cli("-t", target, "--token", "wrong", "eval", "1")
    assert out.returncode == 2 and "token" in out.stderr
