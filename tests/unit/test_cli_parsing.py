"""The CLI grammar's parsing, without processes."""

from __future__ import annotations

import pytest

from torchdoctor.cli.commands.run import split_argv
from torchdoctor.cli.errors import CliError
from torchdoctor.cli.main import main
from torchdoctor.config import Config, ConfigError, from_env, to_env


def test_run_options_stop_at_the_script() -> None:
    assert split_argv(["--guard", "train.py", "--guard", "-m", "x"]) == (
        ["--guard"],
        ["train.py", "--guard", "-m", "x"],
    )
    assert split_argv(["--run-dir", "d", "--trace-every=5", "-m", "pkg.mod", "--lr", "1"]) == (
        ["--run-dir", "d", "--trace-every=5", "-m", "pkg.mod"],
        ["--lr", "1"],
    )
    with pytest.raises(CliError):
        split_argv(["--bogus", "train.py"])


def test_env_config_round_trip() -> None:
    config = from_env(
        {
            "TORCHDOCTOR_TRACE_EVERY": "5",
            "TORCHDOCTOR_GUARD": "1",
            "TORCHDOCTOR_LISTEN": "0.0.0.0:9",
        }
    )
    assert config.trace_every == 5 and config.guard and config.listen == "0.0.0.0:9"
    assert from_env(to_env(config)) == config
    with pytest.raises(ConfigError):
        from_env({"TORCHDOCTOR_LISTEN": "nope"})
    with pytest.raises(ConfigError):
        from_env({"TORCHDOCTOR_HANG_TIMEOUT": "-3"})
    with pytest.raises(ConfigError):
        Config().replace(colour="blue")


def test_usage_errors_exit_2(capsys) -> None:
    assert main(["frobnicate"]) == 2
    assert main(["-t"]) == 2
    assert main(["-t", "1:2", "3:4", "eval", "1"]) == 2
    assert main(["list", "extra"]) == 2
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "torchdoctor:" in err
