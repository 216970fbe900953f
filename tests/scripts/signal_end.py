"""Three training steps, then the process sends itself a signal: how a run ends by signal.

python signal_end.py term|hup|int|abrt      the signal, its disposition left as it is
python signal_end.py handler                SIGTERM to a handler of the script's own,
                                             which checks getsignal and exits 7
python signal_end.py raise                  no signal: an uncaught exception (exit status 1)
python signal_end.py during_stop            the exception, and SIGTERM lands while torchdoctor
                                             writes the run's ending (as torchrun's does when
                                             it stops the ranks after one failed)
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

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if how in ("raise", "during_stop"):
    raise RuntimeError("planted failure after 3 steps")
signum = {"handler": signal.SIGTERM, "term": signal.SIGTERM, "hup": signal.SIGHUP}.get(how)
signum = signum or {"int": signal.SIGINT, "abrt": signal.SIGABRT}[how]
os.kill(os.getpid(), signum)
time.sleep(30)  # a signal that did not end the process: the test fails on the exit code
print("not ended")
