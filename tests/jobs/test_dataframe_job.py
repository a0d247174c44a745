"""DataFrameJob hooks on bounded batches: rows dropped by prepare, finish keeps rows, clear refusals."""

from __future__ import annotations

import importlib.util
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

    with pytest.raises(JobError, match="changed the frame's index"):
        Reindexes().rows(pa.RecordBatch.from_pydict({"n": [10, 11], "m": [1, 2]}))

    class Polars(Echo):
        frame = "polars"

    if importlib.util.find_spec("polars") is None:
        with pytest.raises(ConfigError, match="pip install polars"):
            Polars()
