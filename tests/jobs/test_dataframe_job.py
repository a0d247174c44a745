"""DataFrameJob hooks on bounded batches: rows dropped by prepare, finish keeps rows, clear refusals."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from prefect_swarm.exceptions import ConfigError, JobError
from prefect_swarm.jobs.dataframe import DataFrameJob


class Echo(DataFrameJob):
    outputs = {"text": pa.string()}

    def prepare(self, df: pd.DataFrame) -> pd.DataFrame:
        return df[df["n"] % 2 == 0].assign(prompt=lambda d: "n=" + d["n"].astype(str))

    def request(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"prompt": row["prompt"]}

    def parse(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"text": body["text"]}

    def finish(self, df: pd.DataFrame) -> pd.DataFrame:
        return df.assign(length=df["text"].str.len())


BATCH = pa.RecordBatch.from_pydict({"n": [0, 1, 2, 3]})


def test_prepare_keeps_positions_and_drops_rows() -> None:
    rows = Echo().rows(BATCH)
    assert [r and r["prompt"] for r in rows] == ["n=0", None, "n=2", None]
    assert isinstance(rows[0]["n"], int)  # plain Python values, as request() expects


def test_finish_adds_columns_and_keeps_internal_ones() -> None:
    job = Echo()
    out = job.finish_batch(pa.RecordBatch.from_pydict({"_id": ["a", "b"], "text": ["xy", None]}))
    assert out.schema.names == ["_id", "text", "length"] and out.column("length").to_pylist() == [2, None]
    again = job.finish_batch(pa.RecordBatch.from_pydict({"_id": ["c"], "text": [None]}))
    assert again.schema == out.schema  # later batches follow the first batch's schema


def test_refusals() -> None:
    class Drops(Echo):
        def finish(self, df: pd.DataFrame) -> pd.DataFrame:
            return df.head(1)

    with pytest.raises(JobError, match="must keep every row"):
        Drops().finish_batch(pa.RecordBatch.from_pydict({"text": ["a", "b"]}))

    class Reindexes(Echo):
        def prepare(self, df: pd.DataFrame) -> pd.DataFrame:
            return df.set_index("n")

    with pytest.raises(JobError, match="replaced the rows' key"):
        Reindexes().rows(pa.RecordBatch.from_pydict({"n": [10, 11], "m": [1, 2]}))

    class Polars(Echo):
        frame = "polars"

    if importlib.util.find_spec("polars") is None:
        with pytest.raises(ConfigError, match="pip install polars"):
            Polars()


class FiltersThenResets(Echo):
    """The misuse of issue 22: filter, then reset the index (positions 0..k-1 no longer say which row)."""

    def columns(self) -> dict[str, str]:
        return {"n": "number"}

    def prepare(self, df: pd.DataFrame) -> pd.DataFrame:
        return super().prepare(df).reset_index(drop=True)


class SortsAndMovesTheKey(Echo):
    """Reorders the rows and moves the key into a column: the rows are still matched by it."""

    def prepare(self, df: pd.DataFrame) -> pd.DataFrame:
        return super().prepare(df).sort_values("n", ascending=False).reset_index()


class Duplicates(Echo):
    def prepare(self, df: pd.DataFrame) -> pd.DataFrame:
        return pd.concat([super().prepare(df), super().prepare(df)])


def test_a_prepare_that_loses_the_row_key_is_refused_never_matched_by_position() -> None:
    batch = pa.RecordBatch.from_pydict({"n": list(range(8))})
    with pytest.raises(JobError, match=r"replaced the rows' key .*reset_index\(drop=True\)"):
        FiltersThenResets().rows(batch)
    with pytest.raises(JobError, match="not duplicate or invent them"):
        Duplicates().rows(batch)
    rows = SortsAndMovesTheKey().rows(batch)
    assert [r and r["prompt"] for r in rows] == ["n=0", None, "n=2", None, "n=4", None, "n=6", None]
    assert all(r is None or "_pos" not in r for r in rows)


def test_filter_reset_index_job_exits_2_with_the_reason_and_sends_nothing(tmp_path, stub, monkeypatch) -> None:
    """Through the job process: the shard refuses at its first batch; no request, no output."""
    import pyarrow.parquet as pq
    from _jobkit import requests, run_job, write_spec

    pq.write_table(pa.table({"id": [f"r{i}" for i in range(50)], "n": list(range(50))}), tmp_path / "in.parquet")
    spec = write_spec(tmp_path, endpoints=[stub.url], job="test_dataframe_job:FiltersThenResets", job_kwargs={})
    before = requests(stub)
    res = run_job(spec, env={"PYTHONPATH": str(Path(__file__).parent)})
    assert res.returncode == 2, res.stderr
    assert "FiltersThenResets.prepare replaced the rows' key" in res.stderr
    assert requests(stub) == before
    assert not (tmp_path / "job-out.parquet").exists()


class RaisesInPrepare(Echo):
    """A prepare with a bug of its own: the user must see the cause and where the log is."""

    def columns(self) -> dict[str, str]:
        return {"n": "number"}

    def prepare(self, df: pd.DataFrame) -> pd.DataFrame:
        return df.assign(prompt=df["no_such_column"])


def test_prepare_that_raises_shows_the_cause_and_the_log_through_the_cli(tmp_path, monkeypatch) -> None:
    """`job submit` on a stub swarm: the failure names the job, the rows and the exception, and gives the log path."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from prefect_swarm.cli.main import app
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.swarm import Swarm
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the job processes import this module
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(20)], "n": list(range(20))}), tmp_path / "in.parquet")
    cfg = SwarmConfig.model_validate(stub_swarm_config("df-raises"))
    args = ["job", "submit", "-n", "df-raises", "--input", str(tmp_path / "in.parquet")]
    args += [
        "--output",
        str(tmp_path / "o.parquet"),
        "--id-column",
        "id",
        "--job",
        "test_dataframe_job:RaisesInPrepare",
    ]
    with Swarm(cfg):
        res = CliRunner().invoke(app, args)
    assert res.exit_code == 1, res.output
    assert "RaisesInPrepare refused input rows 0..19" in res.output
    assert "KeyError: 'no_such_column'" in res.output
    assert "it refused its input; log: " in res.output
    log_path = res.output.split("; log: ")[1].split()[0]
    assert Path(log_path).is_file() and "Traceback" in Path(log_path).read_text()
    assert not (tmp_path / "o.parquet").exists()
