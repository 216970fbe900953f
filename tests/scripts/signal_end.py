"""Three training steps, then the process sends itself a signal: how a run ends by signal.

python signal_end.py term|hup|int|abrt      the signal, its disposition left as it is
python signal_end.py handler                SIGTERM to a handler of the script's own,
                                             which checks getsignal and exits 7
python signal_end.py raise                  no signal: an uncaught exception (exit status 1)
python signal_end.py during_stop            the exception, and SIGTERM lands while torchdoctor
                                             writes the run's ending (as torchrun's does when
                                             it stops the ranks after one failed)
python signal_end.py stuck_ending           SIGTERM, and torchdoctor's writing of the ending
                                             never returns (the signal ends the process anyway,
                                             after a watcher deadline of 3 s)
python signal_end.py other_thread           SIGTERM delivered to another thread while the main
                                             thread sleeps in C (no Python handler runs there)
"""

import os
import signal
import sys
import time

import torch

how = sys.argv[1]
if how == "handler":

    def on_term(signum: int, frame: object) -> None:
        print("handler is current:", signal.getsignal(signal.SIGTERM) is on_term, flush=True)
        sys.exit(7)

    signal.signal(signal.SIGTERM, on_term)
elif how == "during_stop":
    from torchdoctor.store import rundir

    real_write_meta = rundir.write_meta

    def write_meta(run_dir: object, meta: dict) -> None:
        if meta["status"] != "running":  # the ending: the signal is handled inside this write
            rundir.write_meta = real_write_meta
            os.kill(os.getpid(), signal.SIGTERM)
        real_write_meta(run_dir, meta)

    rundir.write_meta = write_meta
elif how == "stuck_ending":
    import threading

    from torchdoctor.store import rundir
    from torchdoctor.telemetry import signal_watch

    # the watcher's deadline, read when the signal comes: 3 s instead of 15 (the test waits it)
    signal_watch.DEADLINE = 3.0
    real_write_meta = rundir.write_meta

    def write_meta(run_dir: object, meta: dict) -> None:
        if meta["status"] != "running":
            threading.Event().wait()  # stuck for good
        real_write_meta(run_dir, meta)

    rundir.write_meta = write_meta

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if how in ("raise", "during_stop"):
    raise RuntimeError("planted failure after 3 steps")
if how == "other_thread":
    import threading

    main = threading.main_thread().ident
    with open(__file__) as source:  # the line of the time.sleep(30) below
        sleeping_at = next(n for n, text in enumerate(source, 1) if text.startswith("time.sl"))

    def from_another_thread() -> None:
        frames = sys._current_frames
        while frames()[main].f_lineno != sleeping_at:
            time.sleep(0.01)
        print("sending SIGTERM to a thread that is not the main one", flush=True)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    threading.Thread(target=from_another_thread, daemon=True).start()
else:
    signum = {"handler": signal.SIGTERM, "term": signal.SIGTERM, "hup": signal.SIGHUP}.get(how)
    signum = signal.SIGTERM if how == "stuck_ending" else signum
    os.kill(os.getpid(), signum or {"int": signal.SIGINT, "abrt": signal.SIGABRT}[how])
time.sleep(30)  # a signal that did not end the process: the test fails on the exit code
print("not ended")
