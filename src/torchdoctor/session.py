"""One probe per process: the composition root that every way in ends in (`start(config)`).

It owns the tables and their spill thread, the SQL engine, the endpoint servers, the torch
telemetry (installed once torch is imported) and the doctor thread that runs diagnoses.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchdoctor import _failsafe, registry, run_setup
from torchdoctor import identity as identities
from torchdoctor._failsafe import failed, warn_once
from torchdoctor._version import __version__
from torchdoctor.cluster.watch import ClusterWatch
from torchdoctor.config import Config, from_env, parse_listen, to_env
from torchdoctor.doctor import STARTUP_GRACE, Doctor
from torchdoctor.frames import drop_own_frames
from torchdoctor.probe.cluster_routes import add_cluster_routes
from torchdoctor.probe.routes import build_routes
from torchdoctor.probe.server import TcpServer, UnixServer, serve_in_background
from torchdoctor.redact import redact_argv
from torchdoctor.sql.engine import SqlEngine
from torchdoctor.store import rundir
from torchdoctor.store.columns import Block
from torchdoctor.store.schema import ALL_TABLES, BY_NAME, COLLECTIVES, COMPILE, STEP_PHASES
from torchdoctor.store.tables import Spiller, Tables
from torchdoctor.telemetry import endings, stacks
from torchdoctor.telemetry.on_import import when_imported
from torchdoctor.telemetry.run_summary import RunSummary, children_cpu, ranks_under

if TYPE_CHECKING:  # the Recorder module imports torch: loaded once the script imports it
    from torchdoctor.diagnose.inputs import JobInputs
    from torchdoctor.telemetry.recorder import Recorder

log = logging.getLogger("torchdoctor")

_lock = threading.Lock()
# Reentrant: while the status line is shown, sys.stdout/sys.stderr are wrappers that take it
# too (cli/status.py), and torchdoctor's own alerts write through them.
_print_lock = threading.RLock()
_current: Session | None = None
_status_shown = False


def clear_status_line() -> str:
    """What erases the live status line before other output goes to stderr."""
    global _status_shown
    if not _status_shown:
        return ""
    _status_shown = False
    return "\r\x1b[K"


def erase_status_line(terminal: Any = None) -> None:
    """Erase the status line, if shown, on `terminal` (default: sys.stderr)."""
    with _print_lock:
        text = clear_status_line()
        if text:
            out = terminal or sys.stderr
            out.write(text)
            out.flush()


def show_status_line(text: str, terminal: Any = None) -> None:
    global _status_shown
    with _print_lock:
        out = terminal or sys.stderr
        out.write("\r\x1b[K" + text)
        out.flush()
        _status_shown = True


class LiveSource:
    """The tables of this process as the SQL engine sees them: stored ones and live ones."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def table_names(self) -> list[str]:
        return self.session.table_names()

    def block(self, name: str) -> Block:
        spec = BY_NAME[name]
        if not spec.live:
            training = self.session.telemetry
            if name == COLLECTIVES.name and training is not None:
                training.settle_collectives()  # the calls completed since the last poll
            return self.session.tables[name].snapshot()
        if name == "backtrace":
            return Block.from_rows(spec, stacks.backtrace_rows())
        if name == "threads":
            return Block.from_rows(spec, stacks.thread_rows())
        provider = self.session.live_providers.get(name)
        return Block.from_rows(spec, provider() if provider else [])


class Session:
    """The probe of this process, as an object that owns everything it installs (hooks,
    patches, signal handlers, the excepthook, the endpoint, its threads) and removes it all in
    `stop()`. One runs at a time in a process; one may follow another:

        with torchdoctor.Session("runs/a") as s:     # or Session(run_dir=..., guard=True)
            train()
        s.summary(), s.diagnoses(), s.run_dir        # the record, judged after the fact

    `torchdoctor run`, TORCHDOCTOR=1, `start()` and attach all end in one of these."""

    def __init__(
        self,
        run_dir: str | Path | None = None,
        *,
        config: Config | None = None,
        identity: identities.RankIdentity | None = None,
        **options: Any,
    ) -> None:
        config = config or from_env()
        if run_dir is not None:
            options["run_dir"] = str(run_dir)
        if options:
            config = config.replace(**options)
        config = config.validate()
        self.config = config
        self.pid = os.getpid()
        self.started = time.time()
        self.children_cpu_at_start = children_cpu()  # the summary tells what came since
        self.failures_from = len(_failsafe.FAILURES)  # this session's failures: those after
        argv = list(getattr(sys, "orig_argv", sys.argv))
        self.command = redact_argv(argv, [config.token])  # shown and saved: never the token
        # The script and its arguments, as `list` shows them (not the interpreter's path):
        # `torchdoctor run` sets sys.argv to them before it starts the probe.
        self.script = redact_argv(list(sys.argv), [config.token])
        self.cwd = os.getcwd()
        # `torchdoctor attach` started this probe in a running process: its steps are counted
        # from then on, and whatever shows them says so (None: started with the process).
        self.attached: float | None = None
        # Who this process is in a distributed job (None: not a rank, or not known yet).
        self.identity = identity or identities.from_env()
        self.run_dir = rundir.create(self._record_path())
        self.socket_path: Path | None = None
        self.tables = Tables(max_rows=config.max_rows)
        self.spiller = Spiller(self.tables, self.run_dir)
        self.sql = SqlEngine(LiveSource(self))
        # Live tables computed at query time, by name (the census needs the live objects).
        self.live_providers: dict[str, Any] = {"tensors": self._census}
        self.telemetry: Recorder | None = None  # once torch is imported
        self.doctor: Doctor | None = None
        self.token: str | None = None
        self.tcp_address: tuple[str, int] | None = None
        self.metrics_address: str | None = None  # HOST:PORT of /metrics, once it serves
        self.waiting = False  # a notebook between cells waits for its user: no hang then
        self.resumed = self.started  # silence counts towards a hang from no earlier than this
        self._servers: list[Any] = []
        self._cancel_torch_wait = lambda: None
        self._stopped = False
        self._ending_written = False  # stop() has written the ending (see _on_signal)
        self.exit_code: int | None = None
        self.crash: BaseException | None = None  # the uncaught exception that ended the script
        # The job this process is a rank of (once init_process_group has run).
        self.cluster = ClusterWatch(
            self, registry.socket_path(self.pid), self._collective_timeout, config.token is not None
        )
        self.signal: int | None = None  # the signal that ended (or is ending) the run
        self.endings = endings.Endings(self._on_signal, self.stop)
        self._excepthook: tuple[Any, Any] | None = None  # (ours, the one it replaced)
        self.crash_evidence: Any = None  # its diagnose.crash.CrashEvidence (not for an OOM)
        self.crash_diagnosis: Any = None  # the `crash` or `oom` diagnosis of that exception
        # `torchdoctor run` explains the crash itself, after the traceback: no alert for it then
        self.explains_crash = False
        self.printed: set[str] = set()  # diagnoses shown on stderr: the summary refers to them
        # True while the script is in the middle of a line on the terminal (the status line
        # knows): alerts wait for the line's end, in `_held`
        self.mid_line: Any = None
        self._held: list[str] = []
        self._script_copied: str | None = None  # the hash of the script copied into run_dir
        self._at_start = run_setup.moment()  # how busy the machine was when it started
        self._at_steps: run_setup.Moment | None = None  # ... and when its first step ended
        self._environment = run_setup.environment(secrets=[config.token])  # as it started

    # -- life cycle --------------------------------------------------------------------------
    def __enter__(self) -> Session:
        _activate(self)
        try:
            return self.start()
        except BaseException:
            _deactivate(self)
            raise

    def __exit__(self, kind: Any, value: BaseException | None, tb: Any) -> None:
        if value is not None and not isinstance(value, (SystemExit, GeneratorExit)):
            if isinstance(value, KeyboardInterrupt):
                self.note_signal(signal.SIGINT)
            else:
                self.exit_code = 1
                self.report_crash(value)
        self.stop()

    def start(self) -> Session:
        self._write_meta("running")
        self.spiller.start()
        self._start_servers()
        self._start_doctor()
        self.cluster.start()
        self._cancel_torch_wait = when_imported("torch", self._on_torch)
        self._install_excepthook()
        self.endings.install(self.run_dir)  # SIGTERM, SIGHUP, SIGINT, fatal signals
        atexit.register(self.stop)
        return self

    def _start_servers(self) -> None:
        routes = build_routes(self)
        add_cluster_routes(routes, self.cluster)
        try:
            registry.ensure_dir()
            path = registry.socket_path(self.pid)
            unix = UnixServer(path, routes)
            self._servers.append(unix)
            serve_in_background(unix, "torchdoctor-unix")
        except (OSError, registry.InsecureDirectory) as exc:
            warn_once("unix", f"no Unix socket endpoint: {exc}")
            path = None
        if self.config.listen:
            host, port = parse_listen(self.config.listen)
            self.token = self.config.token or secrets.token_urlsafe(24)
            tcp = TcpServer(host, port, self.token, routes)
            self._servers.append(tcp)
            self.tcp_address = (host, int(tcp.server_address[1]))
            rundir.write_token(self.run_dir, self.token)
            serve_in_background(tcp, "torchdoctor-tcp")
        if self.config.metrics:
            from torchdoctor.probe.metrics import start_metrics_server

            metrics = start_metrics_server(self)  # None (with a warning) when it cannot serve
            if metrics is not None:
                self._servers.append(metrics)
                self.metrics_address = metrics.address
        if path is not None:
            self.socket_path = path
            registry.register(self.pid, self.registry_entry(path))

    def registry_entry(self, socket_path: Path) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "pid": self.pid,
            "socket": str(socket_path),
            "command": self.command,
            "script": self.script,
            "cwd": self.cwd,
            "run_dir": str(self.run_dir),
            "started": self.started,
            "attached": self.attached,
            "version": __version__,
            # What a rank this process launches (mp.spawn) starts with: the same options.
            "config": {k: v for k, v in to_env(self.config).items() if k in _CHILD_OPTIONS},
        }
        if self.identity is not None:
            entry.update(self.identity.as_dict())
        if self.tcp_address:
            entry["tcp"] = f"{self.tcp_address[0]}:{self.tcp_address[1]}"
            entry["token_file"] = str(self.run_dir / rundir.TOKEN_FILE)
        return entry

    # -- rank identity and the job directory ---------------------------------------------------
    def _record_path(self) -> Path | None:
        """Where this process's record goes: the configured or default run directory, or for a
        rank, JOB_DIR/rank<N> (see torchdoctor.identity)."""
        configured = Path(self.config.run_dir) if self.config.run_dir else None
        ident = self.identity
        if ident is None:
            return configured
        if configured is not None:
            # --run-dir JOB/rank1 given to rank 1 is already its place.
            return configured if configured.name == ident.dir_name else configured / ident.dir_name
        launcher = registry.find(os.getppid())  # a probed launcher: its run directory is the job's
        if launcher and launcher.get("run_dir"):
            return Path(launcher["run_dir"]) / ident.dir_name
        parent = Path.cwd() / rundir.DEFAULT_PARENT
        return identities.default_job_dir(parent, os.getppid(), ident) / ident.dir_name

    def set_identity(self, identity: identities.RankIdentity) -> None:
        """torch.distributed told us who we are (init_process_group returned): rows from now on
        carry the rank, and a record begun before it moves into JOB_DIR/rank<N>."""
        if identity == self.identity:
            return
        self.identity = identity
        if self.telemetry is not None:
            self.telemetry.set_rank(identity.rank)
        target = self._record_path()
        if target is not None and target.resolve() != self.run_dir:
            whole = not self.config.run_dir  # a default directory is this process's alone
            try:
                self.run_dir = self.spiller.relocate(lambda old: rundir.move(old, target, whole))
            except OSError as exc:
                warn_once("relocate", f"cannot move the run directory to {target}: {exc}")
        self.endings.fatal_to(self.run_dir)
        self._write_meta("running")
        if self.socket_path is not None:
            try:
                registry.register(self.pid, self.registry_entry(self.socket_path))
            except (OSError, registry.InsecureDirectory):
                pass

    def note_attached(self) -> None:
        """This probe was attached to a process already running (`torchdoctor attach`): step
        0 is the first step after now, the earlier ones were not seen."""
        self.attached = time.time()
        self._write_meta("running")
        if self.socket_path is not None:
            try:
                registry.register(self.pid, self.registry_entry(self.socket_path))
            except (OSError, registry.InsecureDirectory):
                pass

    def _census(self) -> list[tuple[Any, ...]]:
        from torchdoctor.memory.census import census_rows  # the census is heavy: when asked

        return census_rows(self.telemetry)

    def on_first_step(self) -> None:
        """How busy the machine was as the steps began: `compare` judges step times by the
        wait for a CPU from here on, not over the imports and set-up before."""
        if self._at_steps is None:
            self._at_steps = run_setup.moment()

    def on_cuda_detected(self) -> None:
        """Telemetry saw the run use CUDA: start the bounded allocator history."""
        from torchdoctor.memory.cuda_history import start_history

        try:
            start_history()
        except Exception as exc:
            warn_once("cuda-history", f"no CUDA allocator history: {exc}")

    def _install_excepthook(self) -> None:
        # Without `torchdoctor run` (TORCHDOCTOR=1, start(), attach) a crash still gets its
        # out-of-memory analysis before the interpreter exits.
        previous = sys.excepthook

        def hook(kind: Any, value: BaseException, tb: Any) -> None:
            if isinstance(value, KeyboardInterrupt):
                self.note_signal(signal.SIGINT)
            else:
                if self.exit_code is None:
                    self.exit_code = 1  # what Python exits with after an uncaught exception
                if not self._stopped:
                    self.report_crash(value)
            tb = drop_own_frames(tb)  # the traceback the plain run prints
            value.__traceback__ = tb
            previous(kind, value, tb)

        sys.excepthook = hook
        self._excepthook = (hook, previous)

    def _remove_excepthook(self) -> None:
        if self._excepthook is not None:
            ours, previous = self._excepthook
            if sys.excepthook is ours:  # another library wrapped it since: leave theirs
                sys.excepthook = previous
            self._excepthook = None

    def _start_doctor(self) -> None:
        self.doctor = Doctor(self)
        self.doctor.start()

    def save_diagnoses(self) -> None:
        self.spiller.flush(only="diagnoses")

    def job(self) -> JobInputs | None:
        """The ranks of this process's job, as last gathered (None outside a job)."""
        return self.cluster.job_inputs()

    def _collective_timeout(self) -> float:
        """How long a collective may wait before it holds the job up: the hang timeout."""
        if self.doctor is None:
            return STARTUP_GRACE
        return self.doctor.hang_timeout(self.tables["steps"].snapshot())

    def ensure_telemetry(self) -> Recorder | None:
        """The Recorder, installed now if torch is imported but the import hook has not fired
        yet (watch() and step() are called by whoever holds a model)."""
        if self.telemetry is None and "torch" in sys.modules:
            self._on_torch(None)
        return self.telemetry

    def _on_torch(self, _module: Any) -> None:
        try:
            from torchdoctor.telemetry.recorder import Recorder

            rank = self.identity.rank if self.identity is not None else identities.rank_from_env()
            self.telemetry = Recorder(self, rank=rank)
            self.telemetry.install()
            from torchdoctor.telemetry import process_group

            process_group.install(on_rank)  # init_process_group tells the rank
            self.telemetry.hooks.on_remove(process_group.remove)
        except Exception as exc:
            failed("telemetry", f"training telemetry is off: {type(exc).__name__}: {exc}")

    def stop(self, exit_code: int | None = None) -> None:
        if os.getpid() != self.pid:  # atexit in a forked child: the parent's probe is not ours
            return
        with _lock:
            if self._stopped:
                return
            self._stopped = True
        if exit_code is not None:
            self.exit_code = exit_code
        # The ending first: from here on a SIGTERM (torchrun stopping the other ranks after one
        # failed) finds the default disposition, and the teardown below may take a while.
        self._write_meta(self._ending())
        self._ending_written = True
        self.endings.remove()
        self._remove_excepthook()
        atexit.unregister(self.stop)
        self._cancel_torch_wait()
        if self.telemetry is not None:
            self.telemetry.remove()
        self.cluster.stop()
        if self.doctor is not None:
            self.doctor.stop()
        for server in self._servers:
            try:
                server.shutdown()
                server.server_close()
            except Exception:
                pass
        registry.unregister(self.pid)
        self.sql.close()
        try:
            self.spiller.stop()
        except Exception as exc:
            warn_once("spill", f"could not save the last rows: {exc}")
        self._write_meta(self._ending())  # again: the steps counted up to the end
        _deactivate(self)

    def note_signal(self, signum: int) -> None:
        """The run is ending because of `signum` (meta.json says so when it is over)."""
        self.signal = signum

    def _ending(self) -> str:
        if self.signal is not None:
            return endings.STATUS.get(self.signal, "terminated")
        return "finished" if self.exit_code in (None, 0) else "failed"

    def _on_signal(self, signum: int, phase: str) -> None:
        """On the main thread, in the signal's handler (telemetry/endings.py): save the tables
        and the ending now, whatever comes next."""
        # A signal that interrupts stop() before it has written the ending (the handler runs on
        # the thread that was writing it) ends the process now, by this signal: said here.
        if self._stopped and not (phase == endings.GOING and not self._ending_written):
            return
        if phase == endings.SURVIVED:  # the script's handler chose to go on
            self._write_meta("running")
            return
        self.note_signal(signum)
        try:
            self.spiller.flush(timeout=2.0)
        except Exception as exc:
            warn_once("spill", f"could not save the last rows: {exc}")
        self._write_meta(self._ending())
        if phase == endings.GOING:  # no atexit after a default disposition: leave no trace
            self._stopped = True
            self.endings.remove()  # an empty fatal.log goes too
            registry.unregister(self.pid)
            for server in self._servers:
                try:
                    server.server_close()
                except Exception:
                    pass

    def _write_meta(self, status: str) -> None:
        meta = {
            "pid": self.pid,
            "host": socket.gethostname(),
            "command": self.command,
            "cwd": os.getcwd(),
            "started": _dt.datetime.fromtimestamp(self.started).isoformat(),
            "status": status,
            "version": __version__,
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),  # a saved run is judged with its own machine's facts
            "trace_every": self.config.trace_every,
        }
        if self.attached is not None:  # steps count from the attach
            meta["attached"] = _dt.datetime.fromtimestamp(self.attached).isoformat()
        # How it was started (for `compare`): read again at each write, since `__main__` is
        # the script only once `torchdoctor run` has handed over to it.
        script = run_setup.main_script([self.config.token, self.token])
        meta.update(run_setup.facts(script, self._at_start, self._at_steps, self._environment))
        self._copy_script(script)
        if status != "running":
            meta["ended"] = _dt.datetime.now().isoformat()
            meta["exit_code"] = self.exit_code
            if self.telemetry is not None:
                meta["steps"] = self.telemetry.steps_done
            if self.signal is not None:
                meta["signal"] = endings.signal_name(self.signal)
        if self.identity is not None:
            meta.update(self.identity.as_dict())
        if failures := self.failures():
            meta["failures"] = failures  # what the record is missing (store/saved.py says so)
        if self.tcp_address:
            meta["tcp"] = f"{self.tcp_address[0]}:{self.tcp_address[1]}"
        if self.metrics_address:
            meta["metrics"] = self.metrics_address
        try:
            rundir.write_meta(self.run_dir, meta)
        except OSError as exc:
            warn_once("meta", f"cannot write {self.run_dir / rundir.META_FILE}: {exc}")

    def _copy_script(self, script: run_setup.Script | None) -> None:
        path = self.run_dir / rundir.SCRIPT_FILE
        if script is None or script.text is None:
            return
        if script.sha256 == self._script_copied and path.exists():
            return
        try:
            rundir.write_private(path, script.text)
            self._script_copied = script.sha256
        except OSError as exc:
            warn_once("script-copy", f"cannot write {path}: {exc}")

    # -- what the endpoint asks ----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pid": self.pid,
            "command": self.command,
            "run_dir": str(self.run_dir),
            "started": self.started,
            "attached": self.attached,
            "version": __version__,
            "step": None,
        }
        if self.telemetry is not None:
            out.update(self.telemetry.status())
        if self.identity is not None:
            out.update(self.identity.as_dict())
        if self.tcp_address:
            out["tcp"] = f"{self.tcp_address[0]}:{self.tcp_address[1]}"
        if self.metrics_address:
            out["metrics"] = self.metrics_address
        return out

    def failures(self) -> list[str]:
        """The parts of torchdoctor that failed in this process since the session began: what
        its record, and so its diagnoses, are missing."""
        return _failsafe.failures_since(self.failures_from)

    def diagnoses(self) -> list[Any]:
        """The diagnoses found so far (Diagnosis records)."""
        return self.doctor.found() if self.doctor is not None else []

    def flush(self) -> None:
        """Write what the tables hold now to the run directory (a report of a live run)."""
        self.spiller.flush()

    def set_waiting(self, waiting: bool) -> None:
        """A notebook between cells waits for its user, not on its training: the hang watchdog
        stands down while waiting, and counts silence again from when a cell starts."""
        if not waiting:
            self.resumed = time.time()
        self.waiting = waiting

    def table_names(self) -> list[str]:
        return [spec.name for spec in ALL_TABLES]

    def training(self) -> Recorder | None:
        return self.telemetry

    # -- what the user sees ----------------------------------------------------------------------
    def alert(self, diagnosis: Any) -> None:
        """A diagnosis, as it is found, on stderr (unless quiet); never inside a line the
        script is writing on the terminal."""
        if self.config.quiet or not self.config.alerts:
            return
        if self.explains_crash and diagnosis is self.crash_diagnosis:
            return
        from torchdoctor.report.alerts import render_alert

        self.say(render_alert(diagnosis), diagnosis)

    def say(self, text: str, diagnosis: Any = None) -> None:
        """`text` on stderr, once the script's current line on the terminal has ended; the
        summary then refers to `diagnosis` instead of printing it again."""
        with _print_lock:
            if diagnosis is not None:
                self.printed.add(diagnosis.identity)
            if self.mid_line is not None and self.mid_line():
                self._held.append(text)
                return
            self._write(text)

    def release_held(self) -> None:
        """The script ended its line (or ended): the alerts that waited for it."""
        with _print_lock:
            held, self._held = self._held, []
            for text in held:
                self._write(text)

    def _write(self, text: str) -> None:
        try:
            sys.stderr.write(clear_status_line() + text + "\n")
            sys.stderr.flush()
        except Exception:
            pass

    def report_crash(self, exc: BaseException) -> None:
        """The script died of `exc`: explain an out-of-memory with numbers, before the process
        exits, and keep the diagnosis on disk."""
        if exc is self.crash:
            return  # `torchdoctor run` reports it and the excepthook sees it too: once is enough
        self.crash = exc
        # Loaded only now: the capture's modules are heavy and most runs never crash.
        from torchdoctor.diagnose.oom import from_evidence
        from torchdoctor.memory.oom import capture, find_oom

        found = find_oom(exc)
        if found is None:
            self._report_crash(exc)
            return
        if "torch" not in sys.modules:
            return
        try:
            evidence = capture(*found, self.telemetry, str(self.run_dir), self._query)
            diagnosis = from_evidence(evidence)
        except Exception as err:
            warn_once("oom-capture", f"could not analyse the crash: {type(err).__name__}: {err}")
            return
        self.crash_diagnosis = diagnosis
        if self.doctor is not None:
            self.doctor.report(diagnosis)

    def _report_crash(self, exc: BaseException) -> None:
        """Any other exception is a `crash` diagnosis: what it means, the module that raised
        and the shapes that flowed into it."""
        from torchdoctor.diagnose.crash import from_evidence
        from torchdoctor.telemetry.crash import capture

        try:
            self.crash_evidence = capture(exc, self.telemetry)
            diagnosis = from_evidence(self.crash_evidence)
        except Exception as err:
            warn_once("crash-capture", f"could not analyse the crash: {type(err).__name__}: {err}")
            return
        self.crash_diagnosis = diagnosis
        if self.doctor is not None:
            self.doctor.report(diagnosis)

    def _query(self, text: str) -> tuple[list[str], list[Any]]:
        result = self.sql.execute(text, timeout=5.0)
        return result.columns, result.rows

    def summary(self) -> RunSummary:
        """The end-of-run numbers: steps, time by phase, diagnoses, where the run is saved."""
        import numpy as np

        from torchdoctor.digest import time_split

        steps = self.tables["steps"].snapshot()
        compiled = self.tables[COMPILE.name].snapshot()
        at = np.where(compiled.null_mask("step"), -1, compiled.data["step"])
        seconds = np.where(compiled.null_mask("duration"), 0.0, compiled.data["duration"])
        bands, durations = time_split.split(
            {name: steps.data[name] for name in STEP_PHASES},
            steps.data["duration"],
            time_split.by_step(steps.data["step"], at, seconds),
        )
        found = self.doctor.found() if self.doctor is not None else []
        return RunSummary(
            steps=int(steps.rows),
            duration=float(durations.sum()),
            phases=time_split.totals(bands),
            skipped=int(steps.data["skipped"].sum()) if steps.rows else 0,
            last_loss=steps.column("loss")[-1] if steps.rows else None,
            diagnoses=tuple(found),
            run_dir=str(self.run_dir),
            exit_code=self.exit_code,
            crashed=self.crash is not None,
            printed=frozenset(self.printed),
            ranks=ranks_under(self.run_dir) if not steps.rows else (),
            children_cpu=children_cpu() - self.children_cpu_at_start,
            failures=tuple(self.failures()),
        )

    def configure(self, **changes: Any) -> dict[str, Any]:
        allowed = {"trace_every", "guard", "hang_timeout", "alerts"}
        unknown = set(changes) - allowed
        if unknown:
            raise ValueError(f"cannot change {', '.join(sorted(unknown))} on a live run")
        self.config = self.config.replace(**changes)
        return {k: getattr(self.config, k) for k in sorted(allowed)}


# Options a launched rank inherits from a probed launcher (not its endpoints or token).
_CHILD_OPTIONS = frozenset(
    f"TORCHDOCTOR_{name}" for name in ("HANG_TIMEOUT", "TRACE_EVERY", "GUARD", "QUIET")
)


def current() -> Session | None:
    return _current


def on_rank(identity: identities.RankIdentity) -> None:
    """init_process_group returned: the probe of this process learns its rank; a launched
    child without one (mp.spawn, a fork of a probed process) starts it now, as that rank."""
    running = _current
    if running is not None and running.pid == os.getpid():
        running.set_identity(identity)
        return
    config = launcher_config()
    if config is not None:
        start(config, identity=identity)


def launcher_config() -> Config | None:
    """The options a launched rank is probed with: TORCHDOCTOR=1 in its environment, else
    those of the probed process it was forked from or launched by; None: not to be probed."""
    if os.environ.get("TORCHDOCTOR", "").strip().lower() not in ("", "0", "false", "no", "off"):
        return from_env()
    if _forked_from is not None and _forked_from.pid == os.getppid():
        return _forked_from.config
    entry = registry.find(os.getppid())
    if entry is None:
        return None
    inherited = {k: str(v) for k, v in dict(entry.get("config") or {}).items()}
    return from_env(base=from_env(inherited))


def start(
    config: Config | None = None,
    *,
    identity: identities.RankIdentity | None = None,
    **options: Any,
) -> Session:
    """Start the probe in this process (idempotent: a second call returns the running one).
    `identity`: this process is that rank of a job (known before the environment says so)."""
    with _lock:
        running = _current
    if running is not None:
        if options or config is not None:
            warn_once("restart", "already running in this process; new options ignored")
        return running
    session = Session(config=config, identity=identity, **options)
    return session.__enter__()


def _activate(session: Session) -> None:
    """`session` becomes this process's probe (the one the hooks and verbs reach)."""
    global _current
    with _lock:
        if _current is not None and _current is not session:
            raise RuntimeError(
                "a torchdoctor session is already running in this process "
                f"(run directory {_current.run_dir}); stop it first"
            )
        _current = session


def _deactivate(session: Session) -> None:
    global _current
    with _lock:
        if _current is session:
            _current = None


_forked_from: Session | None = None  # in a forked child: the parent's probe, stopped here


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker) inherits the hooks but not the threads: switch the
    # hooks off and forget the session, so the child neither records nor claims the socket.
    # (A forked rank starts its own probe when it calls init_process_group: see on_rank.)
    global _current, _forked_from
    session = _current
    _current = None
    _forked_from = session
    if session is not None and session.telemetry is not None:
        session.telemetry.disable_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
