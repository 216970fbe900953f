"""The SQL engine: NaN stays NaN, NULL stays NULL, the sandbox holds, time is limited."""

from __future__ import annotations

import math

import pytest

from torchdoctor.sql.engine import SqlEngine, SqlError, referenced_tables
from torchdoctor.store.columns import Block
from torchdoctor.store.schema import BY_NAME, STEPS, STORED


class Source:
    def __init__(self, blocks: dict[str, Block]) -> None:
        self.blocks = blocks
        self.asked: list[str] = []

    def table_names(self) -> list[str]:
        return [s.name for s in STORED]

    def block(self, name: str) -> Block:
        self.asked.append(name)
        return self.blocks.get(name) or Block.empty(BY_NAME[name])


def _step(step: int, loss: float | None) -> tuple:
    return (
        step,
        1.0,
        0.5,
        0.1,
        0.1,
        0.1,
        0.1,
        0.1,
        loss,
        1.0,
        0.01,
        1,
        2,
        3,
        4,
        0,
        1,
        False,
        False,
        0.0,
    )


@pytest.fixture
def engine():
    rows = [_step(0, 2.0), _step(1, math.nan), _step(2, None), _step(3, math.inf)]
    source = Source({"steps": Block.from_rows(STEPS, rows)})
    eng = SqlEngine(source)
    yield eng, source
    eng.close()


def test_nan_null_and_inf_are_kept_apart(engine) -> None:
    eng, _ = engine
    result = eng.execute(
        "SELECT step, loss, isnan(loss) AS nan, loss IS NULL AS null "
        "FROM python.steps ORDER BY step"
    )
    rows = result.rows
    assert rows[0][1] == 2.0 and rows[0][2] is False
    assert math.isnan(rows[1][1]) and rows[1][2] is True and rows[1][3] is False
    assert rows[2][1] is None and rows[2][3] is True
    assert rows[3][1] == math.inf


def test_only_named_tables_are_snapshotted(engine) -> None:
    eng, source = engine
    eng.execute("SELECT count(*) FROM python.steps")
    assert source.asked == ["steps"]
    # Catalog queries still see every table, with its columns.
    result = eng.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'python'"
    )
    assert {r[0] for r in result.rows} >= {"steps", "torch_trace", "diagnoses"}


def test_referenced_tables_ignores_strings_and_comments() -> None:
    sql = "SELECT 'python.nope' FROM python.steps -- python.also_not\n JOIN python.\"torch_trace\""
    assert referenced_tables(sql) == {"steps", "torch_trace"}


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "COPY (SELECT 1) TO '/tmp/x.csv'",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET threads = 8",
        "SELECT getenv('HOME')",
    ],
)
def test_sandbox(engine, sql) -> None:
    eng, _ = engine
    with pytest.raises(SqlError):
        eng.execute(sql)


def test_time_limit(engine) -> None:
    eng, _ = engine
    with pytest.raises(SqlError, match="time limit"):
        eng.execute("SELECT count(*) FROM range(10000000000) a, range(100) b", timeout=0.3)
    assert eng.execute("SELECT 1").rows == [(1,)]  # usable afterwards


def test_errors_name_the_users_tables(engine) -> None:
    eng, _ = engine
    with pytest.raises(SqlError) as info:
        eng.execute("SELECT nope FROM python.steps")
    assert "__td_" not in str(info.value)


def test_a_cut_off_result_does_not_block_the_next_query(engine) -> None:
    eng, _source = engine
    big = eng.execute("SELECT * FROM range(1000000)", max_rows=10)
    assert big.truncated and len(big.rows) == 10
    # DuckDB 2 keeps the unfetched rows pending; a table query must still work after it.
    assert eng.execute("SELECT count(*) FROM python.steps").rows == [(4,)]
