"""Processes ended from outside: the launcher told to stop (SIGTERM, SIGHUP, SIGINT), a worker
killed outright (SIGKILL). Neither is an error of the training code, and neither leaves a
traceback of the code that was running; the question is who sent the signal."""

from __future__ import annotations

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix, first
from torchdoctor.errors.torchrun import SIGNALS

# What says the kernel's OOM killer (or a container's memory limit) did it.
MEMORY_EVIDENCE = (
    r"Out of memory: Kill(?:ed)? process|oom-kill(?:er)?|Memory cgroup out of memory"
    r"|\bOOMKilled\b|exceeded (?:its )?memory limit|oom_reaper"
)


def _signal_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    number = (
        first(r"Received (\d+) death signal", message)
        or first(r"got signal:\s*(\d+)", message)
        or first(r"exitcode\s*:\s*-(\d+)", message)
        or first(r"\(exitcode: -(\d+)\)", message)
        or first(r"Signal (\d+) \(SIG\w+\)", message)
    )
    name = first(r"Signals\.(SIG\w+)", message) or first(r"\((SIG\w+)\)", message)
    if number is not None:
        f["signal_number"] = int(number)
        f["signal"] = SIGNALS.get(int(number), f"signal {number}")
    elif name:
        f["signal"] = name
    rank = first(r"local_rank:\s*(\d+)", message) or first(r"\brank\s*:\s*(\d+)", text)
    if rank is not None:
        f["local_rank"] = int(rank)
    if first(f"({MEMORY_EVIDENCE})", text):
        f["memory_evidence"] = first(f"({MEMORY_EVIDENCE})", text)
    return f


STOPPED = Entry(
    code="dist.stopped",
    title="The job was stopped from outside",
    meaning=(
        "torchrun's launcher (or the elastic agent) received a signal and shut its workers "
        "down: 'Received 15 death signal, shutting down workers', then SignalException "
        "'got signal: 15'. Nothing in the training code failed; something outside stopped the "
        "job: a scheduler (a time limit, preemption, scancel, a Kubernetes eviction), a closed "
        "terminal (SIGHUP), Ctrl-C (SIGINT), or a supervising process that stopped it after "
        "another component failed."
    ),
    patterns=(
        r"Received (?:\d+|Signals\.SIG\w+) death signal, shutting down workers",
        r"SignalException: Process \d+ got signal: \d+",
        r"\bgot signal: \d+\b",
        r"Received Signals\.SIG\w+ death signal",
    ),
    secondary=True,
    examples=(
        "W1130 12:13:49.388000 124326 torch/distributed/elastic/agent/server/api.py:723] "
        "Received 15 death signal, shutting down workers",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 8665 got signal: 1",
    ),
    summary=(
        "The launcher received {{signal}} and shut the workers down: the job was stopped from "
        "outside.",
        "The launcher received a signal and shut the workers down.",
    ),
    extract=_signal_fields,
    causes=(
        Cause(
            "hangup",
            "The terminal or SSH session that started the job closed: the launcher got SIGHUP "
            "(nohup alone does not protect a job whose shell is killed with its session).",
            weight=0.5,
            when=lambda f: f.get("signal") == "SIGHUP" or None,
            boost=20,
            only_when=True,
        ),
        Cause(
            "interrupt",
            "Someone pressed Ctrl-C (SIGINT), often because the job looked stuck: a hang is "
            "then the real problem.",
            weight=0.5,
            when=lambda f: f.get("signal") == "SIGINT" or None,
            boost=20,
            only_when=True,
        ),
        Cause(
            "scheduler",
            "The scheduler or the platform stopped the job: a time limit, preemption, "
            "scancel or a node drain (Slurm sends SIGTERM, then SIGKILL), a Kubernetes "
            "eviction or a spot instance reclaimed.",
            weight=2,
            when=lambda f: f.get("signal") in ("SIGTERM", None) or None,
        ),
        Cause(
            "supervisor",
            "A process that supervises the job stopped it after another of its components "
            "failed (an inference server, an orchestrator, a parent launcher): that "
            "component's own log holds the error.",
            weight=1,
            when=lambda f: f.get("signal") == "SIGTERM" or None,
        ),
    ),
    first_steps=(
        "Find who sent the signal: the scheduler's record of the job (`sacct -j JOB -o "
        "State,ExitCode,Elapsed,Timelimit`, `kubectl describe pod`), and the logs of any "
        "process that supervises this one.",
        "If the job looked stuck before it was stopped, the hang is the problem: "
        "`torchdoctor cluster backtrace` shows where every rank waits.",
    ),
    fixes=(
        Fix(
            "Keep the job alive when the terminal closes",
            "nohup torchrun --nproc_per_node=8 train.py > train.log 2>&1 &\n"
            "disown  # or run it inside tmux / screen, or under setsid",
            ("hangup",),
        ),
        Fix(
            "Stop cleanly and resume: save checkpoints, ask for enough time",
            "#SBATCH --time=24:00:00 --signal=B:USR1@300   # a warning before the kill\n"
            "torchrun ... train.py --resume-from latest.pt",
            ("scheduler", "supervisor"),
        ),
        Fix(
            "Look at where the ranks stood before the Ctrl-C",
            "torchdoctor cluster backtrace  # while it hangs, instead of killing it",
            ("interrupt",),
        ),
    ),
)


KILLED = Entry(
    code="dist.killed",
    title="A process was killed (SIGKILL)",
    meaning=(
        "A worker ended with SIGKILL (exit code -9 in torchrun's report, 137 in a shell, "
        "'Killed'). SIGKILL cannot be caught, so the process wrote nothing: no traceback, no "
        "error. The usual sender is the kernel's OOM killer when host RAM runs out, but a "
        "scheduler enforcing a memory or time limit, a container runtime, or a `kill -9` send "
        "it too; only the kernel log or the scheduler's record says which."
    ),
    patterns=(
        r"failed \(exitcode: -9\)",
        r"exitcode\s*:\s*-9\b",
        r"Signal 9 \(SIGKILL\) received",
        r"died with <Signals\.SIGKILL: 9>",
        r"exit(?:ed with)? (?:code|status) 137\b",
        r"(?-i:^Killed\s*$)",
        r"(?-i:\bKilled\s+\S*python)",
    ),
    priority=2,
    examples=(
        "E0325 20:57:27.620000 2606 site-packages/torch/distributed/elastic/multiprocessing/"
        "api.py:869] failed (exitcode: -9) local_rank: 5 (pid: 2630) of binary: /usr/bin/python",
        "exitcode  : -9 (pid: 14750)\n  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) "
        "received by PID 14750",
        "Killed",
    ),
    summary=(
        "A worker was killed with SIGKILL and {{memory_evidence}} in the text says why: host "
        "RAM ran out.",
        "Local rank {{local_rank}} was killed with SIGKILL (exit code -9); it wrote no error.",
        "A process was killed with SIGKILL; it wrote no error.",
    ),
    extract=_signal_fields,
    causes=(
        Cause(
            "oom_killer",
            "Host RAM may have run out, and the kernel's OOM killer chose the process (it "
            "picks the largest: often rank 0 while it loads a checkpoint or the whole dataset "
            "once per rank); nothing in the text says so, the kernel log does.",
            weight=2,
            when=lambda f: bool(f.get("memory_evidence")) or None,
            evidence="Host RAM ran out: '{{memory_evidence}}' in the text is the kernel's OOM "
            "killer at work.",
            boost=20,
            signals=(r"Loading checkpoint shards|load_state_dict|torch\.load|from_pretrained",),
        ),
        Cause(
            "limit",
            "The scheduler or the container runtime enforced a limit: a job's memory request "
            "(Slurm, Kubernetes OOMKilled) or its time limit followed by SIGKILL.",
            weight=1,
        ),
        Cause(
            "manual",
            "Someone or something ran `kill -9` (a cleanup script, a watchdog, another user).",
            weight=0.2,
        ),
    ),
    first_steps=(
        "Ask the kernel: `dmesg -T | grep -i -E 'killed process|out of memory'` on the node "
        "(or `journalctl -k`); in a container, its status (OOMKilled) and memory limit.",
        "Watch the host memory of each rank while the job starts (`free -g`, `top`): "
        "loading a checkpoint or a dataset once per rank multiplies it.",
    ),
    fixes=(
        Fix(
            "Load weights without holding several copies in RAM",
            "model = AutoModelForCausalLM.from_pretrained(path, low_cpu_mem_usage=True,\n"
            "                                             torch_dtype=torch.bfloat16)\n"
            'state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)',
            ("oom_killer",),
            needs=("memory_evidence",),
            check="Check first that memory was the reason: `dmesg -T | grep -i killed`.",
        ),
        Fix(
            "Ask the scheduler for more memory, or run fewer ranks per node",
            "#SBATCH --mem=0            # all of the node's memory\n"
            "torchrun --nproc_per_node=4 train.py   # fewer copies of the data per node",
            ("limit", "oom_killer"),
        ),
    ),
)

ENTRIES = (STOPPED, KILLED)
