"""The options shared by every way in: command-line flags, environment variables, start() arguments.

One dataclass, one table of (field, env var, parser). Flags win over env vars, which win over
defaults; start() keyword arguments win over everything.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any


class ConfigError(ValueError):
    """A bad option value; the message names the option."""


def parse_listen(value: str, flag: str = "--listen") -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{flag} expects HOST:PORT, got {value!r}")
    return (host or "127.0.0.1"), int(port)


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _positive_float(name: str) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            out = float(value)
        except ValueError:
            raise ConfigError(f"{name} expects a number of seconds, got {value!r}") from None
        if out <= 0:
            raise ConfigError(f"{name} must be positive, got {value!r}")
        return out

    return parse


def _positive_int(name: str) -> Callable[[str], int]:
    def parse(value: str) -> int:
        if not value.strip().isdigit() or int(value) < 0:
            raise ConfigError(f"{name} expects a whole number >= 0, got {value!r}")
        return int(value)

    return parse


def _flag(value: str) -> bool:
    return value.strip().lower() not in ("", "0", "false", "no", "off")


@dataclasses.dataclass
class Config:
    run_dir: str | None = None  # None: ./torchdoctor-runs/<date>-<host>-<pid>
    listen: str | None = None  # HOST:PORT for TCP; None: Unix socket only
    token: str | None = None  # TCP token; generated when listening without one
    hang_timeout: float | None = None  # None: scaled to the run's own step time
    trace_every: int = 20  # trace module calls on one step in N; 0 turns tracing off
    guard: bool = False  # skip updates whose gradients are not finite
    quiet: bool = False  # no live status line, no end-of-run summary
    alerts: bool = True  # print diagnoses on stderr as they are found
    max_rows: int | None = None  # rows kept per table, in memory and on disk (None: each its own)
    metrics: str | None = None  # HOST:PORT of the Prometheus /metrics endpoint
    metrics_open: bool = False  # /metrics without the token (a loopback address only)

    def validate(self) -> Config:
        if self.listen is not None:
            parse_listen(self.listen)
        if self.metrics is not None:
            host, _ = parse_listen(self.metrics, "--metrics")
            if self.metrics_open and host not in LOOPBACK:
                raise ConfigError(f"--metrics-open is for 127.0.0.1 or ::1 only, not {host!r}")
        if self.trace_every < 0:
            raise ConfigError("--trace-every must be >= 0")
        if self.hang_timeout is not None and self.hang_timeout <= 0:
            raise ConfigError("--hang-timeout must be positive")
        return self

    def replace(self, **changes: Any) -> Config:
        known = {f.name for f in dataclasses.fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ConfigError(f"unknown option(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes).validate()


# field name -> (environment variable, parser of its text)
ENV_VARS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "run_dir": ("TORCHDOCTOR_RUN_DIR", str),
    "listen": ("TORCHDOCTOR_LISTEN", str),
    "token": ("TORCHDOCTOR_TOKEN", str),
    "hang_timeout": ("TORCHDOCTOR_HANG_TIMEOUT", _positive_float("TORCHDOCTOR_HANG_TIMEOUT")),
    "trace_every": ("TORCHDOCTOR_TRACE_EVERY", _positive_int("TORCHDOCTOR_TRACE_EVERY")),
    "guard": ("TORCHDOCTOR_GUARD", _flag),
    "quiet": ("TORCHDOCTOR_QUIET", _flag),
    "max_rows": ("TORCHDOCTOR_MAX_ROWS", _positive_int("TORCHDOCTOR_MAX_ROWS")),
    "metrics": ("TORCHDOCTOR_METRICS", str),
    "metrics_open": ("TORCHDOCTOR_METRICS_OPEN", _flag),
}


def from_env(environ: Mapping[str, str] | None = None, base: Config | None = None) -> Config:
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field, (var, parse) in ENV_VARS.items():
        text = env.get(var)
        if text is not None and text != "":
            values[field] = parse(text)
    return (base or Config()).replace(**values)


def to_env(config: Config) -> dict[str, str]:
    """The environment that makes a child process start with the same options."""
    out: dict[str, str] = {}
    for field, (var, _) in ENV_VARS.items():
        value = getattr(config, field)
        if value is None or value is False:
            continue
        out[var] = "1" if value is True else str(value)
    return out


def add_arguments(parser: Any) -> None:
    """The shared options as argparse flags (used by `run` and `attach`)."""
    parser.add_argument("--run-dir", metavar="DIR", help="where tables and diagnoses are saved")
    parser.add_argument("--listen", metavar="HOST:PORT", help="also serve TCP (token required)")
    parser.add_argument("--token", help="token for TCP clients (generated when omitted)")
    parser.add_argument(
        "--hang-timeout",
        type=_positive_float("--hang-timeout"),
        metavar="SECONDS",
        help="report a hang after this long without a step (default: scaled to step time)",
    )
    parser.add_argument(
        "--trace-every",
        type=_positive_int("--trace-every"),
        metavar="N",
        help="trace module calls on one step in N (default 20; 1 = every step; 0 = off)",
    )
    parser.add_argument(
        "--guard",
        action="store_true",
        default=None,
        help="skip optimizer updates whose gradients are not finite",
    )
    parser.add_argument("--metrics", metavar="HOST:PORT", help="serve Prometheus /metrics (token)")
    parser.add_argument(
        "--metrics-open",
        action="store_true",
        default=None,
        help="serve /metrics without the token (127.0.0.1 or ::1 only)",
    )


def from_args(args: Any, base: Config | None = None) -> Config:
    config = from_env(base=base)
    changes = {
        name: getattr(args, name)
        for name in (
            *("run_dir", "listen", "token", "hang_timeout", "trace_every", "guard"),
            *("metrics", "metrics_open"),
        )
        if getattr(args, name, None) is not None
    }
    if getattr(args, "quiet", False):
        changes["quiet"] = True
    return config.replace(**changes)
