"""Distributed training: NCCL timeouts and errors, rendezvous, ports, world size, collective
mismatches, DDP."""

from __future__ import annotations

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix, all_of, first, rx

_ALL_RANKS = (
    "Read every rank's log and find the first error in time: the rank that failed first "
    "holds the root cause, the others only report that they stopped hearing from it."
)


def _minutes(ms: int) -> str:
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    return f"{minutes:.0f} min" if abs(minutes - round(minutes)) < 0.05 else f"{minutes:.1f} min"


_WATCHDOG = (
    r"\[(?:PG \S+ (?:\([^)]*\) )?)?Rank {rank}\]\s*Watchdog caught collective operation "
    r"timeout: (WorkNCCL\(.*?\) ran for \d+ milliseconds)"
)


def _timeout_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    if first(r"SeqNum=(\d+)", message) is None:
        # A line that only says the rank gave up ("Some NCCL operations have failed"): the
        # numbers are on the same rank's watchdog line elsewhere in the log.
        rank = first(r"\[(?:PG \S+ (?:\([^)]*\) )?)?Rank (\d+)\]", message) or r"\d+"
        watchdog = first(_WATCHDOG.format(rank=rank), text)
        if watchdog is not None:
            message = f"{message} {watchdog}"
    for name, pattern in (
        ("seq", r"SeqNum=(\d+)"),
        ("op", r"OpType=(\w+)"),
        ("numel_in", r"NumelIn=(\d+)"),
    ):
        value = first(pattern, message)
        if value is not None:
            f[name] = value
    timeout = first(r"Timeout\(ms\)=(\d+)", message) or first(r"Timed out waiting (\d+)ms", message)
    if timeout is not None:
        f["timeout_ms"] = int(timeout)
        f["timeout"] = _minutes(int(timeout))
    ran = first(r"ran for (\d+) milliseconds", message)
    if ran is not None:
        f["ran_for"] = _minutes(int(ran))
    seen: dict[str, tuple[str, str]] = {}
    for m in all_of(
        r"\[(?:PG \S+ (?:\([^)]*\) )?)?Rank (\d+)\]\s*Watchdog caught collective operation "
        r"timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)",
        text,
    ):
        seen.setdefault(m.group(1), (m.group(2), m.group(3)))
    if seen:
        f["ranks_timed_out"] = ", ".join(sorted(seen, key=int))
    if len({seq for seq, _op in seen.values()}) > 1:
        f["seq_by_rank"] = ", ".join(
            f"rank {r} at #{seq} {op}"
            for r, (seq, op) in sorted(seen.items(), key=lambda t: int(t[0]))
        )
    return f


NCCL_TIMEOUT = Entry(
    code="nccl.timeout",
    title="NCCL collective timed out",
    meaning=(
        "A collective (all_reduce, broadcast, all_gather, barrier, ...) did not complete "
        "within the process group's timeout, and NCCL's watchdog aborted the communicator. "
        "Every rank must enter the same collectives in the same order; a timeout means at "
        "least one rank did not arrive: it crashed, it is stuck, it is slow, or it took a "
        "different code path."
    ),
    patterns=(
        r"Watchdog caught collective operation timeout",
        r"WorkNCCL\(.*\) ran for \d+ milliseconds before timing out",
        r"Some NCCL operations have failed or timed out",
        r"collective operation timeout",
        r"NCCL (?:timeout|operation timed out)",
        r"retrieving ncclUniqueId from \[\d+\] via c10d key-value store.*(?:Timeout|timed out)",
        r"watchdog (?:got stuck|thread terminated)|Heartbeat monitor timed out",
    ),
    examples=(
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2001, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600051 "
        "milliseconds before timing out.",
        "RuntimeError: NCCL communicator was aborted on rank 2. Original reason for the abort "
        "was: Watchdog caught collective operation timeout.",
    ),
    summary=(
        "Rank {{rank}} waited {{ran_for}} in collective #{{seq}} ({{op}}) and gave up at the "
        "{{timeout}} timeout; ranks reached different collectives: {{seq_by_rank}}.",
        "Rank {{rank}} waited {{ran_for}} in collective #{{seq}} ({{op}}) and gave up at the "
        "{{timeout}} timeout.",
        "A {{op}} did not complete within the {{timeout}} timeout.",
        "Rank {{rank}} gave up waiting for a collective operation.",
        "A collective operation did not complete within the timeout.",
    ),
    extract=_timeout_fields,
    priority=10,
    secondary=True,
    causes=(
        Cause(
            "rank_failed",
            "Another rank failed or exited first (an exception, an out-of-memory error, a "
            "kill) and the others waited in the collective until the timeout.",
            weight=3,
        ),
        Cause(
            "diverged",
            (
                "The ranks are at different collectives ({{seq_by_rank}}): their code paths "
                "diverged (a collective under `if rank == 0`, an early break, an extra batch "
                "on some ranks, a data-dependent branch).",
                "The ranks waited in different calls ({{calls_by_rank}}): their code paths "
                "diverged, and each waits for a partner that is in another collective.",
                "The ranks' code paths diverged: a collective under `if rank == 0`, an early "
                "break, or a data-dependent branch leaves one rank waiting alone.",
            ),
            weight=2.5,
            when=lambda f: "seq_by_rank" in f or "calls_by_rank" in f,
        ),
        Cause(
            "uneven",
            "The ranks process different numbers of batches (no drop_last, uneven shards, an "
            "iterable dataset not split evenly), so one rank enters an extra collective alone.",
            weight=2,
        ),
        Cause(
            "slow",
            (
                "One rank is slow on purpose (saving a checkpoint or evaluating on rank 0 "
                "only, a slow filesystem) for longer than the {{timeout}} timeout.",
                "One rank is slow on purpose (checkpointing or evaluating on rank 0 only, a "
                "slow filesystem) for longer than the timeout.",
            ),
            weight=1.5,
            signals=(r"save|checkpoint|evaluat|validat",),
            boost=3,
        ),
        Cause(
            "network",
            "Network trouble between nodes (wrong interface, firewall, InfiniBand set-up) "
            "stalls the transfer.",
            weight=1,
            signals=(r"NCCL WARN|No route to host|Connection (?:refused|reset)|socket",),
        ),
        Cause(
            "init",
            "Rank 0 never published the NCCL id: it crashed, started late, or took another "
            "path before its first collective.",
            weight=0.5,
            signals=(r"ncclUniqueId|store->get",),
            boost=12,
        ),
    ),
    first_steps=(
        _ALL_RANKS,
        "Compare where each rank stopped: the SeqNum and OpType of the watchdog lines differ "
        "between ranks when their code paths diverged.",
        "On a run that hangs, dump every rank's stacks (`torchdoctor ENDPOINT backtrace`, or "
        "py-spy dump) to see which collective each waits in.",
        "Log every collective with NCCL_DEBUG=INFO and TORCH_DISTRIBUTED_DEBUG=DETAIL.",
    ),
    fixes=(
        Fix(
            "Every rank calls every collective",
            "dist.all_reduce(metric)          # on all ranks\n"
            "if dist.get_rank() == 0:\n"
            "    print(metric.item())         # only the printing is rank 0's",
            ("diverged", "init"),
        ),
        Fix(
            "The same number of batches on every rank",
            "sampler = DistributedSampler(ds, drop_last=True)\n"
            "loader = DataLoader(ds, batch_size=64, sampler=sampler, drop_last=True)",
            ("uneven",),
        ),
        Fix(
            "Rank-0 work followed by a barrier, with a timeout long enough for it",
            'dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=30))\n'
            "if dist.get_rank() == 0:\n"
            '    torch.save(model.state_dict(), "ckpt.pt")\n'
            "dist.barrier()",
            ("slow",),
        ),
        Fix(
            "Use the right network interface",
            "export NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0\n"
            "export NCCL_IB_DISABLE=1  # only to test whether InfiniBand is the problem",
            ("network",),
        ),
        Fix(
            "See every collective",
            "NCCL_DEBUG=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --nproc_per_node=8 train.py",
            ("rank_failed",),
        ),
    ),
)


def _nccl_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    for name, pattern, source in (
        ("nccl_version", r"NCCL version ([\d.]+\S*)", text),
        (
            "kind",
            r"(unhandled system error|unhandled cuda error|invalid usage|internal error|invalid "
            r"argument|remote process exited or there was a network error)",
            f"{message}\n{text}",
        ),
        ("last_error", r"Last error:\s*(.+?)\s*$", message),
        ("cuda_failure", r"Cuda failure '([^']+)'", text),
        ("peer", r"Connect to (\S+) failed", text),
        ("peer_error", r"Connect to \S+ failed\s*:\s*(.+?)\s*$", text),
    ):
        value = first(pattern, source)
        if value:
            f[name] = value
    m = first(r"Duplicate GPU detected\s*:\s*(rank \d+ and rank \d+ both on CUDA device \w+)", text)
    if m:
        f["duplicate_gpu"] = m
    return f


NCCL_ERROR = Entry(
    code="nccl.error",
    title="NCCL error",
    meaning=(
        "NCCL, the library that moves tensors between GPUs, failed. The kind of error says "
        "where to look: a system error is usually the network or shared memory, a CUDA error "
        "is a GPU problem on this rank, invalid usage is a set-up mistake, and a remote error "
        "means another rank went away."
    ),
    patterns=(
        r"NCCL error in:",
        r"\bnccl(?:System|Internal|InvalidUsage|InvalidArgument|UnhandledCuda|Remote)Error\b",
        r"unhandled (?:system|cuda) error",
        r"NCCL communicator was aborted",
        r"NCCL WARN .*(?:failed|error|No route)",
        r"NCCL error:",
        r"ncclCommInitRank failed",
        r"Duplicate GPU detected",
    ),
    examples=(
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for "
        "details), NCCL version 2.20.5",
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed "
        "or device error. Last error: socketStartConnect: Connect to 10.0.0.2<36759> failed : "
        "No route to host",
        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, "
        "invalid usage, NCCL version 2.7.8",
    ),
    summary=(
        "NCCL {{nccl_version}} failed with '{{kind}}': {{last_error}}.",
        "NCCL failed with '{{kind}}' (NCCL {{nccl_version}}).",
        "NCCL failed with '{{kind}}'.",
        "NCCL reported an error.",
    ),
    extract=_nccl_fields,
    causes=(
        Cause(
            "network",
            (
                "NCCL could not reach a peer ({{peer}}: {{peer_error}}): wrong network "
                "interface, a firewall, or nodes on different subnets.",
                "Network problem between ranks: wrong interface picked, a firewall between "
                "nodes, or nodes on different subnets.",
            ),
            weight=2,
            signals=(
                r"unhandled system error|No route to host|Connection refused|socket|Connect to"
                r"|network error",
            ),
        ),
        Cause(
            "duplicate_gpu",
            (
                "Two ranks share one GPU ({{duplicate_gpu}}): each process must select its "
                "own with torch.cuda.set_device(local_rank) before using NCCL.",
                "Two ranks share one GPU: each process must call "
                "torch.cuda.set_device(local_rank) before using NCCL.",
            ),
            weight=1,
            signals=(r"Duplicate GPU|invalid usage",),
        ),
        Cause(
            "p2p",
            "Direct GPU-to-GPU (peer-to-peer) transfers do not work on this machine: consumer "
            "GPUs, a VM, or the PCIe switch's ACS/IOMMU settings in the way. NCCL then fails "
            "with 'unhandled cuda error' (or hangs) on the first collective.",
            weight=1.2,
            signals=(r"unhandled cuda error|\bP2P\b|peer access|NCCL_P2P",),
        ),
        Cause(
            "cuda",
            (
                "A CUDA failure on this rank ({{cuda_failure}}) surfaced through NCCL.",
                "A CUDA problem on this rank (out of memory, an earlier failed kernel) "
                "surfaced through NCCL.",
            ),
            weight=1,
            signals=(r"unhandled cuda error|Cuda failure|out of memory",),
            when=lambda f: "cuda_failure" in f or None,
        ),
        Cause(
            "peer_died",
            "Another rank died or was killed; its log holds the root error.",
            weight=1.5,
            signals=(r"remote process exited|communicator was aborted|Connection reset",),
        ),
        Cause(
            "shm",
            "NCCL's shared-memory transport failed: /dev/shm is too small in a container.",
            weight=0.5,
            signals=(r"/dev/shm|\bshm\b|shared memory",),
        ),
        Cause(
            "setup",
            "An InfiniBand/RDMA set-up problem or NCCL versions that differ between nodes.",
            weight=0.5,
            signals=(r"\bIB\b|ibv_|InfiniBand|NET/IB",),
        ),
    ),
    first_steps=(
        "Rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET) to see the interface and "
        "transport NCCL picks and the call that fails.",
        _ALL_RANKS,
        "Test connectivity between nodes on the master port: `nc -zv <master_addr> 29500`.",
    ),
    fixes=(
        Fix(
            "Pin NCCL to the right interface",
            "export NCCL_SOCKET_IFNAME=eth0   # the interface of the training network\n"
            "export GLOO_SOCKET_IFNAME=eth0",
            ("network",),
        ),
        Fix(
            "One GPU per rank",
            'local_rank = int(os.environ["LOCAL_RANK"])\n'
            "torch.cuda.set_device(local_rank)\n"
            'dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))',
            ("duplicate_gpu",),
        ),
        Fix(
            "Give containers enough shared memory",
            "docker run --gpus all --ipc=host ...   # or --shm-size=16g",
            ("shm",),
        ),
        Fix(
            "Rule InfiniBand in or out",
            "NCCL_IB_DISABLE=1 torchrun ...  # slower; only to locate the problem",
            ("setup", "network"),
        ),
        Fix(
            "Rule peer-to-peer transfers out",
            "NCCL_P2P_DISABLE=1 torchrun --nproc_per_node=8 train.py\n"
            "nvidia-smi topo -m   # how the GPUs are connected",
            ("p2p",),
        ),
        Fix(
            "Expose the CUDA error itself",
            "CUDA_LAUNCH_BLOCKING=1 torchrun --nproc_per_node=8 train.py",
            ("cuda",),
        ),
    ),
)


def _port_fields(message: str, text: str) -> Fields:
    port = (
        first(r"bind to \[?[\w.:]*?\]?:(\d{2,5})\b", message)
        or first(r"\bport\s*[=:]?\s*(\d{2,5})\b", message)
        or first(r"(?:MASTER_PORT|master_port|rdzv_endpoint)\s*[= :]\s*\S*?(\d{4,5})\b", text)
        or first(r":(\d{4,5})\b", message)
    )
    if port is None:
        return {}
    return {"port": int(port), "next_port": int(port) + 1}


ADDRESS_IN_USE = Entry(
    code="dist.address_in_use",
    title="Address already in use",
    meaning=(
        "The rendezvous store (or another server) could not listen on its port because a "
        "process already holds it. With torchrun the master's TCPStore listens on "
        "MASTER_PORT, 29500 by default."
    ),
    patterns=(
        r"Address already in use",
        r"\bEADDRINUSE\b",
        r"errno: 98\b",
        r"\[Errno 98\]",
        r"WinError 10048",
    ),
    examples=(
        "RuntimeError: Address already in use",
        "OSError: [Errno 98] Address already in use",
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
        "local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, "
        "message: address already in use",
    ),
    summary=(
        "Port {{port}} is already taken by another process.",
        "The port the rendezvous needs is already taken by another process.",
    ),
    extract=_port_fields,
    causes=(
        Cause(
            "stale",
            (
                "A previous run (or one of its ranks) is still alive and holds port {{port}}.",
                "A previous run (or one of its ranks) is still alive and holds the port.",
            ),
            weight=3,
        ),
        Cause(
            "two_jobs",
            "Two jobs on the same node use the same MASTER_PORT (the default 29500).",
            weight=2,
            signals=(r"\b29500\b",),
            boost=1,
        ),
        Cause(
            "all_master",
            "Every process believes it is rank 0 (RANK not set per process), so all try to "
            "start the store on the same port.",
            weight=1,
            signals=(r"TCPStore|is_master",),
        ),
        Cause(
            "time_wait",
            "The port was just released and is still in TIME_WAIT; a retry a few seconds "
            "later succeeds.",
            weight=0.3,
        ),
    ),
    first_steps=(
        (
            "See who holds it: `lsof -i :{{port}}` or `ss -ltnp | grep {{port}}`.",
            "See who holds the port: `lsof -i :29500` or `ss -ltnp`.",
        ),
        "Look for leftover processes of an earlier run: `pgrep -af train.py`.",
    ),
    fixes=(
        Fix(
            "Use another port",
            (
                "torchrun --master_port={{next_port}} --nproc_per_node=8 train.py\n"
                "# or: export MASTER_PORT={{next_port}}",
                "torchrun --master_port=29501 --nproc_per_node=8 train.py",
            ),
            ("two_jobs", "stale"),
        ),
        Fix(
            "End the leftover process",
            ("lsof -t -i :{{port}} | xargs -r kill", "lsof -t -i :29500 | xargs -r kill"),
            ("stale",),
        ),
        Fix(
            "Let torchrun pick a free port on a single node",
            "torchrun --standalone --nproc_per_node=8 train.py",
            ("two_jobs", "all_master"),
        ),
    ),
)


def _world_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    for name, pattern in (
        ("world_size", r"world[_ ]size\s*(?:\(|=|:|of)\s*(\d+)"),
        ("world_size", r"number of world size \((\d+)\)"),
        ("expected", r"expected \(?(\d+)\)?"),
        ("worker_count", r"worker_count=(\d+)"),
        ("bad_rank", r"Invalid rank (\d+)"),
    ):
        value = first(pattern, message)
        if value is not None and name not in f:
            f[name] = int(value)
    return f


WORLD_SIZE = Entry(
    code="dist.world_size",
    title="World size or rank mismatch",
    meaning=(
        "The processes disagree on how many of them there are, or a rank is outside "
        "[0, world_size). Every process of a job must be started with the same world size "
        "and a unique rank, and all of them must join before training starts."
    ),
    patterns=(
        r"world[ _]size.{0,40}(?:not equal|does not match|mismatch)",
        r"number of world size",
        r"Invalid rank \d+",
        r"rank \d+ is (?:out of range|invalid)",
        r"Timed out initializing process group in store based barrier",
        r"worker_count=\d+",
    ),
    examples=(
        "RuntimeError: The number of world size (4) is not equal to the expected (8)",
        "RuntimeError: Timed out initializing process group in store based barrier on rank: "
        "3, for key: store_based_barrier_key:1 (world_size=8, worker_count=4, timeout=0:30:00)",
        "ValueError: Invalid rank 8, rank should be in the interval [0, 7]",
    ),
    summary=(
        "Only {{worker_count}} of {{world_size}} processes joined the process group.",
        "The world size is {{world_size}} but {{expected}} was expected.",
        "Rank {{bad_rank}} is outside the world.",
        "The processes disagree on the world size or the ranks.",
    ),
    extract=_world_fields,
    causes=(
        Cause(
            "launch",
            (
                "Not every process started: {{worker_count}} of {{world_size}} joined "
                "(a node that never launched, or one that crashed during start-up).",
                "The launch commands disagree: --nnodes, --nproc_per_node or WORLD_SIZE "
                "differ between nodes, or a node never started.",
            ),
            weight=3,
        ),
        Cause(
            "manual_env",
            "WORLD_SIZE or RANK are set by hand (or hard-coded in the script) and do not "
            "match what the launcher provides.",
            weight=2,
            signals=(r"Invalid rank|rank \d+ is",),
        ),
        Cause(
            "node_failed",
            "A node failed before joining: an import error, a different code version or "
            "path on that node, or no GPU there.",
            weight=1,
        ),
    ),
    first_steps=(
        "Print RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT at the start of "
        "every process and compare.",
        "Check that every node runs the same launch command with its own --node_rank.",
    ),
    fixes=(
        Fix(
            "Identical launch on every node (here 2 nodes of 4 GPUs)",
            "# node 0\n"
            "torchrun --nnodes=2 --nproc_per_node=4 --node_rank=0 \\\n"
            "    --master_addr=node0 --master_port=29500 train.py\n"
            "# node 1: the same with --node_rank=1",
            ("launch", "node_failed"),
        ),
        Fix(
            "Let the launcher set rank and world size",
            'dist.init_process_group("nccl")  # reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT',
            ("manual_env",),
        ),
    ),
)


def _connect_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    m = rx(r"trying to connect to \(([^,()]+), (\d+)\)").search(message)
    if m is not None:
        f["host"], f["port"] = m.group(1), int(m.group(2))
    seconds = first(r"timed out after (\d+)m?s", message)
    if seconds:
        f["waited"] = int(seconds)
    return f


CONNECT = Entry(
    code="dist.connect",
    title="Cannot connect to the rendezvous or a peer",
    meaning=(
        "A process could not connect to the rendezvous store on MASTER_ADDR:MASTER_PORT, or "
        "lost the connection to a peer. Either the address is wrong or unreachable, or the "
        "process at the other end is not there (not started yet, or already dead)."
    ),
    patterns=(
        r"client socket has timed out after \d+m?s while trying to connect to",
        r"\bDistNetworkError\b",
        r"Connection refused",
        r"client socket has failed to connect to any network address",
        r"TCP client failed to connect",
        r"failed to connect to .* \(errno: \d+",
        r"Rendezvous(?:Connection|Timeout)Error",
        r"Temporary failure in name resolution|Name or service not known",
    ),
    examples=(
        "torch.distributed.DistNetworkError: The client socket has timed out after 900s while "
        "trying to connect to (node0, 29500).",
        "RuntimeError: The client socket has failed to connect to any network address of "
        "(node0, 29500).",
    ),
    summary=(
        "Could not reach the rendezvous at {{host}}:{{port}} within {{waited}} s.",
        "The connection to the rendezvous or to a peer failed.",
    ),
    extract=_connect_fields,
    secondary=True,
    causes=(
        Cause(
            "address",
            "MASTER_ADDR or the port is wrong or unreachable from this node (firewall, DNS, "
            "a hostname that resolves differently on each node).",
            weight=2,
            signals=(r"timed out after|name resolution|not known|refused",),
            boost=2,
        ),
        Cause(
            "master_late",
            "The master (rank 0 / node 0) started much later or failed before opening the store.",
            weight=1,
        ),
    ),
    first_steps=(
        _ALL_RANKS,
        "From the failing node: `nc -zv $MASTER_ADDR $MASTER_PORT` and `getent hosts "
        "$MASTER_ADDR`.",
    ),
    fixes=(
        Fix(
            "Use an address every node can reach",
            "torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d \\\n"
            "    --rdzv-endpoint=10.0.0.1:29500 train.py  # an IP, not a local hostname",
            ("address", "master_late"),
        ),
    ),
)

ENV_MISSING = Entry(
    code="dist.env_missing",
    title="Distributed environment variables not set",
    meaning=(
        "init_process_group (env:// rendezvous) or the script reads RANK, WORLD_SIZE, "
        "LOCAL_RANK, MASTER_ADDR or MASTER_PORT from the environment, and they are not set: "
        "the script was started with plain `python` instead of a launcher."
    ),
    patterns=(
        r"environment variable \w+ expected, but not set",
        r"Error initializing torch\.distributed using env://",
        r"(?:rank|world_size|MASTER_ADDR|MASTER_PORT) is not set but it is required for env://",
        r"_env_error\(\"(?:RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT)\"\)",
        r"KeyError: '(?:LOCAL_RANK|RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|LOCAL_WORLD_SIZE)'",
    ),
    examples=(
        "ValueError: Error initializing torch.distributed using env:// rendezvous: environment "
        "variable RANK expected, but not set",
        "KeyError: 'LOCAL_RANK'",
    ),
    summary=(
        "{{variable}} is not set: the script expects to be started by a distributed launcher.",
    ),
    extract=lambda message, text: (
        {"variable": v.upper()}
        if (
            v := first(r"(?:variable |KeyError: '|_env_error\(\")([A-Z_]+)", message)
            or first(r"\b(rank|world_size|MASTER_ADDR|MASTER_PORT) is not set", message)
        )
        else {}
    ),
    causes=(
        Cause(
            "plain_python",
            "The script was run with `python train.py` instead of `torchrun`.",
            weight=2,
        ),
        Cause(
            "scheduler",
            "A scheduler wrapper (srun, mpirun) starts the processes but does not export the "
            "variables PyTorch expects.",
            weight=1,
            signals=(r"srun|slurm|mpirun|SLURM",),
        ),
    ),
    first_steps=("Print os.environ in the failing process and compare with torchrun's variables.",),
    fixes=(
        Fix(
            "Start it with torchrun",
            "torchrun --standalone --nproc_per_node=4 train.py",
            ("plain_python", "scheduler"),
        ),
        Fix(
            "Run single-process without a launcher too",
            'local_rank = int(os.environ.get("LOCAL_RANK", 0))\n'
            'if "RANK" in os.environ:\n'
            '    dist.init_process_group("nccl")',
            ("plain_python",),
        ),
    ),
)


def _unused_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    names = first(
        r"Parameters which did not receive grad for rank \d+:\s*([\w.,\s]+?)(?:\s*Parameter|$)",
        text,
    )
    if names:
        f["unused_parameters"] = ", ".join(n.strip() for n in names.split(",") if n.strip())
    indices = first(r"Parameter indices which did not receive grad for rank \d+:\s*([\d\s]+)", text)
    if indices:
        f["unused_indices"] = " ".join(indices.split())
    return f


DDP_UNUSED = Entry(
    code="ddp.unused_parameters",
    title="DDP: parameters did not receive gradients",
    meaning=(
        "DistributedDataParallel waits for a gradient of every parameter before it reduces a "
        "bucket. Parameters that took no part in computing the loss never get one, so the "
        "reduction of the previous iteration never finished."
    ),
    patterns=(
        r"Expected to have finished reduction in the prior iteration before starting a new one",
        r"did not receive grad for rank",
    ),
    examples=(
        "RuntimeError: Expected to have finished reduction in the prior iteration before "
        "starting a new one. This error indicates that your module has parameters that were "
        "not used in producing loss. ... Parameters which did not receive grad for rank 0: "
        "aux_head.weight, aux_head.bias",
    ),
    summary=(
        "These parameters got no gradient: {{unused_parameters}}.",
        "Parameters with indices {{unused_indices}} got no gradient.",
        "Some parameters of the DDP model took no part in the loss.",
    ),
    extract=_unused_fields,
    causes=(
        Cause(
            "unused_branch",
            (
                "Part of the model ({{unused_parameters}}) is not used in this forward "
                "(an auxiliary head, a branch taken only sometimes, a frozen-but-trainable "
                "layer).",
                "Part of the model is not used in this forward (an auxiliary head, a branch "
                "taken only sometimes).",
            ),
            weight=3,
        ),
        Cause(
            "outputs_unused",
            "Some forward outputs do not contribute to the loss, so their parameters get no "
            "gradient.",
            weight=1.5,
        ),
        Cause(
            "frozen",
            "Layers meant to be frozen still have requires_grad=True.",
            weight=1,
        ),
    ),
    first_steps=(
        "Set TORCH_DISTRIBUTED_DEBUG=DETAIL to get the names of the parameters without gradients.",
    ),
    fixes=(
        Fix(
            "Tell DDP that some parameters may be unused (costs a graph traversal per step)",
            "model = DDP(model, device_ids=[local_rank], find_unused_parameters=True)\n"
            "# mmdetection-style configs: find_unused_parameters = True",
            ("unused_branch", "outputs_unused"),
        ),
        Fix(
            "Freeze what is not trained",
            "for p in model.aux_head.parameters():\n    p.requires_grad_(False)",
            ("frozen", "unused_branch"),
        ),
    ),
)


def _mismatch_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    sizes = rx(r"op\.preamble\.length <= op\.nbytes\.\s*(\d+) vs (\d+)").search(message)
    sizes = sizes or rx(r"local size (\d+) remote size (\d+)").search(message)
    if sizes is not None:
        if "local size" in sizes.group(0).lower():
            f["expected"], f["received"] = int(sizes.group(1)), int(sizes.group(2))
        else:
            f["received"], f["expected"] = int(sizes.group(1)), int(sizes.group(2))
    if rx(r"gloo").search(message):
        f["backend"] = "gloo"
    elif rx(r"NCCL").search(message):
        f["backend"] = "NCCL"
    # TORCH_DISTRIBUTED_DEBUG=DETAIL names both sides: "Rank 1 is running collective:
    # CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], ...), but
    # Rank 2 is running collective: CollectiveFingerPrint(...)".
    sides = all_of(
        r"Rank (\d+) is running (?:collective|inconsistent collective):\s*CollectiveFingerPrint\("
        r"SequenceNumber=(\d+),\s*OpType=(\w+)(?:,\s*TensorShape=(\[[^\]]*\]))?"
        r"(?:,\s*TensorDtypes=(\w+))?",
        message,
    )
    if len(sides) >= 2:
        f["mismatch"] = "; ".join(
            f"rank {m.group(1)}: {m.group(3)} #{m.group(2)}"
            + (f" {m.group(4)}" if m.group(4) else "")
            + (f" {m.group(5)}" if m.group(5) else "")
            for m in sides[:2]
        )
        dtypes = {m.group(5) for m in sides[:2]}
        f["dtypes_differ"] = len(dtypes) > 1 and None not in dtypes
    return f


COLLECTIVE_MISMATCH = Entry(
    code="dist.collective_mismatch",
    title="Ranks ran collectives that do not line up",
    meaning=(
        "A collective pairs the n-th call of every rank. When one rank calls a collective "
        "the others skip, calls them in another order, or passes a tensor of another size "
        "or dtype, the data that arrives does not fit what the receiver posted. gloo checks "
        "the size and aborts the process (`terminate called after throwing an instance of "
        "'gloo::EnforceNotMet'`, SIGABRT, no Python traceback); NCCL's network transport "
        "reports a collective mismatch; with TORCH_DISTRIBUTED_DEBUG=DETAIL torch compares "
        "the calls itself and raises first. The other ranks then lose their peer "
        "(connection reset or closed by peer): that is a consequence."
    ),
    patterns=(
        r"Is there a distributed collective mismatch",
        r"Received data size doesn't match expected size",
        r"op\.preamble\.length <= op\.nbytes",
        r"Detected mismatch between collectives on ranks",
        r"Mismatched collective detected",
        r"NET/\w+ ?: .*collective mismatch error",
        r"(?-i:collective mismatch)",
    ),
    examples=(
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
        "tcp/pair.cc:456] op.preamble.length <= op.nbytes. 64 vs 4. Received data size "
        "doesn't match expected size. Is there a distributed collective mismatch in your code?",
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running "
        "collective: CollectiveFingerPrint(SequenceNumber=0, OpType=ALLGATHER, "
        "TensorShape=[8, 16], TensorDtypes=Float), but Rank 2 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=0, OpType=ALLGATHER, TensorShape=[9, 16], "
        "TensorDtypes=Float).",
        "NCCL WARN NET/IB : req 0/1 tag 0 peer 10.0.0.6<58683> collective mismatch error, "
        "local size 496640 remote size 65536",
    ),
    summary=(
        "The ranks' collectives do not line up: {{mismatch}}.",
        "{{backend}} aborted rank {{rank}} ({{signal}}): a peer sent {{received}} bytes where "
        "this rank expected {{expected}}, so the ranks were not in the same collective with "
        "the same tensor.",
        "A peer sent {{received}} bytes where rank {{rank}} expected {{expected}}: the ranks "
        "were not in the same collective with the same tensor.",
        "A peer sent {{received}} bytes where {{expected}} were expected: the ranks were not "
        "in the same collective with the same tensor.",
        "The ranks' collectives do not line up (another op, order, shape or dtype).",
    ),
    extract=_mismatch_fields,
    priority=5,
    causes=(
        Cause(
            "rank_conditional",
            "A collective runs on some ranks only: under `if rank == 0` (a metric reduced "
            "for logging, an evaluation, a checkpoint), so the others pair their next "
            "collective (often DDP's gradient reduction) with it.",
            weight=3,
        ),
        Cause(
            "shapes",
            (
                "The same collective runs with tensors of other sizes on different ranks "
                "({{mismatch}}): a last batch of another size, data-dependent lengths passed "
                "to all_gather, a model built differently on one rank.",
                "The same collective runs with tensors of other sizes on different ranks: a "
                "last batch of another size, data-dependent lengths passed to all_gather, a "
                "model built differently on one rank.",
            ),
            weight=2,
            signals=(r"TensorShape=|all_?gather",),
            boost=2,
        ),
        Cause(
            "uneven",
            "One rank runs more steps than the others (uneven shards, no drop_last), so its "
            "extra step's collectives meet the others' next calls.",
            weight=1.5,
        ),
        Cause(
            "order",
            "The ranks call collectives in another order: iteration over a set or an unsorted "
            "dict, parameters registered in another order, different code on different nodes.",
            weight=1,
        ),
        Cause(
            "dtype",
            "The ranks pass tensors of different dtypes (one rank under autocast or cast to "
            "half): the same shape, another byte count.",
            weight=0.5,
            when=lambda f: f.get("dtypes_differ"),
        ),
    ),
    first_steps=(
        'Look for collectives under rank-dependent code: `grep -nE "rank *==|is_main|'
        'get_rank\\(\\)" train.py` and check what runs inside each branch.',
        "Rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL: torch then compares the op, shape and dtype "
        "of every collective across ranks and raises with both sides before the data moves.",
        "Under torchdoctor (TORCHDOCTOR=1, TORCHDOCTOR_RUN_DIR=DIR), `torchdoctor cluster "
        "diagnoses` on the live job, or `torchdoctor diagnoses DIR` after it died, gives the "
        "collective_mismatch finding: the first collective the ranks disagree on, with each "
        "rank's op, shape and source line.",
        "The other ranks' 'Connection reset by peer' or 'Connection closed by peer' only says "
        "that this rank died.",
    ),
    fixes=(
        Fix(
            "Every rank calls the same collectives, in the same order, with the same shapes "
            "and dtypes",
            "loss_sum = loss.detach().clone()\n"
            "dist.all_reduce(loss_sum)           # on every rank\n"
            "if dist.get_rank() == 0:\n"
            "    print(loss_sum.item() / dist.get_world_size())  # only the printing is rank 0's",
            ("rank_conditional", "order", "dtype"),
        ),
        Fix(
            "Gather tensors of different lengths by padding them to the longest",
            "n = torch.tensor([x.shape[0]])\n"
            "sizes = [torch.zeros_like(n) for _ in range(dist.get_world_size())]\n"
            "dist.all_gather(sizes, n)\n"
            "longest = int(max(sizes))\n"
            "padded = torch.nn.functional.pad(x, (0, 0, 0, longest - x.shape[0]))\n"
            "out = [torch.empty_like(padded) for _ in sizes]\n"
            "dist.all_gather(out, padded)\n"
            "parts = [o[: int(s)] for o, s in zip(out, sizes)]",
            ("shapes",),
        ),
        Fix(
            "The same number of steps on every rank",
            "sampler = DistributedSampler(ds, drop_last=True)\n"
            "loader = DataLoader(ds, batch_size=64, sampler=sampler, drop_last=True)",
            ("uneven",),
        ),
        Fix(
            "Have torch check every collective's op, shape and dtype across ranks",
            "TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --nproc_per_node=8 train.py",
            ("rank_conditional", "shapes", "order", "dtype"),
        ),
        Fix(
            "See the first collective the ranks disagree on, with each rank's line",
            "TORCHDOCTOR=1 TORCHDOCTOR_RUN_DIR=runs/job torchrun --nproc_per_node=8 train.py\n"
            "torchdoctor diagnoses runs/job      # after the job died\n"
            "torchdoctor cluster diagnoses       # while it runs",
            ("rank_conditional", "uneven", "order", "shapes"),
        ),
    ),
)


def _child_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    code = first(r"exitcode\s*:\s*(-?\d+)", message) or first(r"\(exitcode: (-?\d+)\)", message)
    if code is not None:
        f["exitcode"] = int(code)
    rank = first(r"\brank\s*:\s*(\d+)", message) or first(r"local_rank: (\d+)", message)
    if rank is not None:
        f["rank"] = int(rank)
    return f


CHILD_FAILED = Entry(
    code="dist.child_failed",
    title="A worker of torchrun failed (its own error is elsewhere)",
    meaning=(
        "torchrun's launcher saw a worker process exit with an error and stopped the others "
        "(ChildFailedError). The launcher's summary only names the rank, its exit code and "
        "the time; the error itself is in that rank's own output, earlier in the log or in "
        "its log file, and the summary carries a traceback only when the script's entry point "
        "is decorated with torch.distributed.elastic's @record."
    ),
    patterns=(
        r"To enable traceback see:? https?://\S*elastic/errors",
        r"\bChildFailedError\b",
        r"failed \(exitcode: -?\d+\) local_rank: \d+",
    ),
    examples=(
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ... Root Cause "
        "(first observed failure): [0]: rank : 0 (local_rank: 0) exitcode : 1 (pid: 78970) "
        "error_file: <N/A> traceback : To enable traceback see: "
        "https://pytorch.org/docs/stable/elastic/errors.html",
        "E0822 16:10:35.525161 139625 torch/distributed/elastic/multiprocessing/api.py:833] "
        "failed (exitcode: 1) local_rank: 0 (pid: 1754335) of binary: /usr/bin/python",
    ),
    summary=(
        "Rank {{rank}} exited with code {{exitcode}}; its own error is not in this text.",
        "A worker exited with code {{exitcode}}; its own error is not in this text.",
        "A worker of the job failed; its own error is not in this text.",
    ),
    extract=_child_fields,
    secondary=True,
    priority=-5,
    causes=(
        Cause(
            "own_output",
            "The rank raised an exception; its traceback went to the rank's own output (above "
            "the summary when all ranks share the terminal, else its --log-dir file or the "
            "scheduler's per-task log), which this text does not hold.",
            weight=3,
        ),
        Cause(
            "usage",
            "Exit code 2 is argparse's: the script rejected its command-line arguments (an "
            "option torchrun passed through, a typo in the launch command).",
            weight=0.5,
            when=lambda f: f.get("exitcode") == 2,
            only_when=True,
        ),
        Cause(
            "import",
            "The script failed before training: an import error or a missing file, which "
            "every rank hits at once.",
            weight=1,
            signals=(r"ModuleNotFoundError|ImportError|FileNotFoundError",),
        ),
    ),
    first_steps=(
        "Scroll up to the first `[rankN]: Traceback`: the first rank to fail holds the root "
        "cause (`torchdoctor explain` on the whole log picks it).",
        "Run the same command with one process (--nproc_per_node=1) to see the error alone.",
    ),
    fixes=(
        Fix(
            "Put the worker's traceback into the launcher's summary",
            "from torch.distributed.elastic.multiprocessing.errors import record\n\n"
            "@record\n"
            "def main():\n"
            "    ...",
            ("own_output",),
        ),
        Fix(
            "Keep every rank's output, prefixed and in files",
            "torchrun --nproc_per_node=8 --tee 3 --log-dir logs/ train.py",
            ("own_output", "import"),
        ),
        Fix(
            "Check the arguments the script receives",
            "torchrun --nproc_per_node=1 train.py --help",
            ("usage",),
        ),
    ),
)


def _gloo_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    timeout = first(r"Timed out waiting (\d+)ms", message)
    if timeout is not None:
        f["timeout_ms"] = int(timeout)
        f["timeout"] = _minutes(int(timeout))
    op = first(r"for (recv|send) operation", message)
    if op:
        f["op"] = op
    call = first(
        r"in (all_gather\w*|all_reduce|broadcast\w*|gather\w*|barrier|reduce\w*|send|recv)"
        r"\b",
        text,
    )
    if call:
        f["call"] = call
    return f


GLOO_TIMEOUT = Entry(
    code="gloo.timeout",
    title="gloo collective timed out",
    meaning=(
        "A collective or point-to-point call on a gloo process group (the CPU backend; also "
        "what metrics, object gathers and barriers often use next to NCCL) waited longer than "
        "the group's timeout, 30 minutes by default, for a peer that never sent or received. "
        "gloo has no watchdog: the call itself raises in the thread that made it, on the rank "
        "that waited. The peer did not come: it failed, it is slow, or it took another path."
    ),
    patterns=(
        r"unbound_buffer\.cc:\d+\] Timed out waiting \d+ms for (?:recv|send) operation",
        r"Timed out waiting \d+ms for (?:recv|send) operation to complete",
        r"Application timeout caused pair closure",
        r"gloo.*\bTimed out\b",
    ),
    priority=1,
    secondary=True,
    examples=(
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
        "waiting 1800000ms for recv operation to complete",
    ),
    summary=(
        "A gloo {{op}} waited {{timeout}} for its peer and gave up.",
        "A gloo call waited for its peer longer than the timeout and gave up.",
    ),
    extract=_gloo_fields,
    causes=(
        Cause(
            "peer_failed",
            "The peer rank failed or exited first (an exception, out of memory, a kill); its "
            "own log holds the root error.",
            weight=2,
        ),
        Cause(
            "diverged",
            "The ranks reached different calls: a gather of metrics or objects run by some "
            "ranks only (evaluation on rank 0, a branch on rank), or an extra batch on one rank.",
            weight=2,
            signals=(r"gather|all_gather_object|evaluat|comm\.py",),
            boost=1,
            when=lambda f: "calls_by_rank" in f,
            evidence=(
                "The ranks waited in different calls ({{calls_by_rank}}): their code paths "
                "diverged, and each waits for a partner that is in another call.",
            ),
        ),
        Cause(
            "slow_peer",
            "The peer is alive but busy for longer than the timeout: evaluating, saving a "
            "checkpoint or loading data on one rank while the others wait in a gloo call.",
            weight=1.5,
            signals=(r"evaluat|save|checkpoint|epoch",),
            boost=1,
        ),
        Cause(
            "network",
            "The nodes cannot exchange data on the interface gloo picked (a wrong interface "
            "across nodes, a firewall).",
            weight=0.5,
        ),
    ),
    first_steps=(
        _ALL_RANKS,
        "Dump the stacks of the rank that did not arrive (`torchdoctor ENDPOINT backtrace`, "
        "py-spy dump): it is either dead, elsewhere in the code, or still busy.",
    ),
    fixes=(
        Fix(
            "Every rank makes the same gloo calls, in the same order",
            "metrics = evaluate(model)                 # on every rank\n"
            "gathered = [None] * dist.get_world_size()\n"
            "dist.all_gather_object(gathered, metrics)  # not under `if rank == 0`",
            ("diverged", "peer_failed"),
        ),
        Fix(
            "A timeout long enough for the slow step, or a barrier after it",
            'dist.init_process_group("nccl", timeout=datetime.timedelta(hours=2))\n'
            'cpu_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=2))',
            ("slow_peer",),
        ),
        Fix(
            "Pin gloo to the interface the nodes share",
            "export GLOO_SOCKET_IFNAME=eth0",
            ("network",),
        ),
    ),
)


PEER_LOST = Entry(
    code="dist.peer_lost",
    title="A peer went away in the middle of the run",
    meaning=(
        "A connection to another rank was closed or reset while the job was running: gloo "
        "reports 'Connection closed by peer' or 'Connection reset by peer' when the process at "
        "the other end exited or died. This rank did nothing wrong; the question is why the "
        "other one left: it crashed, was killed, or finished and exited while this rank still "
        "exchanged data with it."
    ),
    patterns=(
        r"Connection closed by peer",
        r"(?:gloo|pair\.cc|c10d|socket\.cpp|rank).*Connection reset by peer",
        r"Read error \[[^\]]*\]:\d+: Connection reset",
        r"gloo::IoException",
        r"Broken pipe.*(?:gloo|c10d|pair\.cc)",
        r"(?:gloo|c10d|pair\.cc).*Broken pipe",
    ),
    secondary=True,
    examples=(
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
        "by peer [127.0.0.1]:38032",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error "
        "[192.168.70.92]:25266: Connection reset by peer",
    ),
    summary=(
        "The connection to the rank at {{peer}} was closed: that process exited or died.",
        "A connection to another rank was closed: that process exited or died.",
    ),
    extract=lambda message, text: (
        {"peer": p.replace("]", "")}
        if (p := first(r"by peer \[?([\w.:]+\]?:\d+)", message))
        else {}
    ),
    causes=(
        Cause(
            "peer_died",
            "The other rank died first: an exception, an out-of-memory kill (SIGKILL, no "
            "traceback), or a crash of the process; its own log holds the root error.",
            weight=3,
        ),
        Cause(
            "peer_exited",
            "The other rank finished and exited while this one still talked to it: it ran "
            "fewer steps (uneven data, an early break), or returned without waiting for an "
            "isend to complete.",
            weight=1.5,
            signals=(r"isend|irecv|send\(|recv\(",),
            boost=2,
        ),
        Cause(
            "connection_dropped",
            "Something between the nodes closed an idle connection (a firewall or NAT "
            "timeout on long pauses such as evaluation).",
            weight=0.3,
        ),
    ),
    first_steps=(
        _ALL_RANKS,
        "Look for the other rank's traceback, an exit code or a signal in the launcher's "
        "summary (`exitcode: -9` is a SIGKILL), and the kernel log of its node.",
    ),
    fixes=(
        Fix(
            "Find the rank that left first",
            "torchrun --nproc_per_node=4 --tee 3 --log-dir logs/ train.py\n"
            "torchdoctor explain logs/   # the first rank's own error",
            ("peer_died",),
        ),
        Fix(
            "End every rank together",
            "req = dist.isend(tensor, dst=1)\n"
            "req.wait()                    # before leaving\n"
            "dist.barrier()\n"
            "dist.destroy_process_group()",
            ("peer_exited",),
        ),
    ),
)


BACKEND_UNAVAILABLE = Entry(
    code="dist.backend_unavailable",
    title="The distributed backend is not built into this PyTorch",
    meaning=(
        "init_process_group asked for a backend this PyTorch does not have: NCCL exists only "
        "in the CUDA builds for Linux (not on Windows or macOS, not in CPU-only builds), MPI "
        "only in builds from source with MPI, and NCCL needs a GPU per process."
    ),
    patterns=(
        r"Distributed package doesn't have (?:NCCL|MPI|Gloo|UCC) built in",
        r"Backend (?:nccl|mpi|ucc) not available",
        r"ProcessGroupNCCL is only supported with GPUs, no GPUs found",
        r"use_libuv was requested but PyTorch was buil[dt] without libuv support",
    ),
    keys=(r"doesn't have NCCL",),
    priority=4,
    examples=(
        "RuntimeError: Distributed package doesn't have NCCL built in",
        "RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!",
    ),
    summary=(
        "This PyTorch has no {{backend}} backend.",
        "The requested distributed backend is not part of this PyTorch build.",
    ),
    extract=lambda message, text: (
        {"backend": b}
        if (b := first(r"doesn't have (\w+) built in|Backend (\w+) not available", message))
        else ({"backend": "NCCL"} if "ProcessGroupNCCL" in message else {})
    ),
    causes=(
        Cause(
            "platform",
            "NCCL does not exist on Windows or macOS: PyTorch for those platforms ships gloo only.",
            weight=2,
            when=lambda f: f.get("platform") in ("windows", "macos") or None,
            boost=10,
        ),
        Cause(
            "cpu_build",
            "A CPU-only PyTorch is installed (no CUDA, hence no NCCL).",
            weight=1,
            when=lambda f: f.get("cuda_build") == "cpu" or None,
            boost=10,
        ),
        Cause(
            "no_gpu",
            "No GPU is visible to the process, and NCCL works only between GPUs.",
            weight=0.5,
            signals=(r"no GPUs found",),
            boost=10,
        ),
        Cause(
            "libuv",
            "On Windows, torch >= 2.4 asks for a libuv TCPStore the Windows wheels lack.",
            weight=0.2,
            signals=(r"libuv",),
            boost=20,
        ),
    ),
    first_steps=(
        'python -c "import torch, torch.distributed as d; print(torch.__version__, '
        'd.is_nccl_available(), d.is_gloo_available(), torch.cuda.is_available())"',
    ),
    fixes=(
        Fix(
            "Use the gloo backend where NCCL does not exist (Windows, macOS, CPU)",
            'backend = "nccl" if dist.is_nccl_available() and torch.cuda.is_available() '
            'else "gloo"\n'
            "dist.init_process_group(backend)\n"
            "# or train under WSL2 / Linux, where NCCL exists",
            ("platform", "cpu_build", "no_gpu"),
        ),
        Fix(
            "Install a CUDA build of PyTorch (Linux)",
            "pip install torch --index-url https://download.pytorch.org/whl/cu126",
            ("cpu_build",),
        ),
        Fix(
            "Turn libuv off on Windows",
            "set USE_LIBUV=0\ntorchrun --nproc_per_node=2 train.py",
            ("libuv",),
        ),
    ),
)


DEVICE_ID = Entry(
    code="dist.device_id",
    title="init_process_group was given a device_id that is not an accelerator",
    meaning=(
        "device_id binds the process group to one GPU (or other accelerator) with an index, "
        "so that NCCL can set up its communicators early. A CPU device, or an accelerator "
        "device without an index ('cuda' instead of 'cuda:0'), cannot be bound: the call is "
        "refused before any rank connects. Scripts written for GPUs meet it when they run on "
        "a machine without one, where their device falls back to the CPU."
    ),
    patterns=(r"init_process_group device_id parameter must be an accelerator with an index",),
    keys=(r"device_id parameter must be an accelerator",),
    priority=4,
    examples=(
        "ValueError: init_process_group device_id parameter must be an accelerator with an index",
    ),
    summary=(
        "init_process_group's device_id must be an accelerator device with an index (a GPU "
        "as torch.device('cuda', local_rank)); it was given something else, most often the "
        "CPU.",
    ),
    causes=(
        Cause(
            "cpu_fallback",
            "The script picks the CPU when no GPU is found and passes that device on as "
            "device_id (the gloo backend on CPU needs no device_id).",
            weight=2,
        ),
        Cause(
            "no_index",
            "The device has no index: torch.device('cuda') rather than torch.device('cuda', "
            "local_rank).",
            weight=1,
            signals=(r"device_id=torch\.device\(['\"]cuda['\"]\)",),
            boost=10,
        ),
    ),
    first_steps=(
        "print the device the script passes as device_id on each rank, and "
        "torch.cuda.is_available()",
    ),
    fixes=(
        Fix(
            "Pass device_id only for an accelerator",
            'device_id = device if device.type != "cpu" else None\n'
            "dist.init_process_group(backend, device_id=device_id)",
            ("cpu_fallback",),
        ),
        Fix(
            "Give the accelerator its index (the rank's local GPU)",
            'local_rank = int(os.environ["LOCAL_RANK"])\n'
            'device = torch.device("cuda", local_rank)\n'
            "torch.cuda.set_device(device)\n"
            'dist.init_process_group("nccl", device_id=device)',
            ("no_index",),
        ),
    ),
)


ENTRIES = (
    NCCL_TIMEOUT,
    NCCL_ERROR,
    ADDRESS_IN_USE,
    WORLD_SIZE,
    CONNECT,
    COLLECTIVE_MISMATCH,
    ENV_MISSING,
    DDP_UNUSED,
    CHILD_FAILED,
    GLOO_TIMEOUT,
    PEER_LOST,
    BACKEND_UNAVAILABLE,
    DEVICE_ID,
)
