"""DataFrameJob: a job written over DataFrames, ``prepare(df)`` before the requests, ``finish(df)`` after.

::

    class Topics(DataFrameJob):
        outputs = {"text": pa.string()}

        def columns(self):
            return {"title": "string", "body": "string"}          # input columns prepare reads

        def prepare(self, df):
            df = df[df["body"].str.len() > 0]                     # rows dropped here get no request
            return df.assign(prompt="Topic of: " + df["title"] + "\\n" + df["body"])

        def request(self, row):
            return {"messages": [{"role": "user", "content": row["prompt"]}], **self.sampling}

        def parse(self, body):
            return {"text": body["choices"][0]["message"]["content"]}

        def finish(self, df):
            return df.assign(topic=df["text"].str.split().str[0])   # after the answers: parse, score

Both hooks see bounded batches, never the whole dataset: ``prepare`` one input batch of the job
process at a time (``read_batch_rows`` rows, default 8192), ``finish`` one batch of the commit at a
time, so memory stays flat whatever the input size.

- ``prepare(df)`` gets the batch's input columns (those of :meth:`columns`, plus the id column);
  it may add or change columns and drop rows. A dropped row gets no request and ends in the
  output with null outputs, status ``ok`` and no tokens (a filter is not a failure). The rows
  kept are matched by a key the framework owns: a pandas frame's index, named ``_pos`` (filter,
  sort and assign keep it; ``reset_index()`` moves it to a ``_pos`` column, which is read there),
  or the ``_pos`` column polars frames are given (keep it). A prepare that loses the key
  (``reset_index(drop=True)``, ``set_index``, ``merge``) or repeats a row is refused with the
  reason, never matched by position.
- ``finish(df)`` gets the output batch (input columns, outputs, status, error, tokens) and
  returns it with columns added or changed; it must keep every row, in order. The first batch's
  result fixes the output schema; later batches are cast to it. ``finish`` applies to parquet
  output; the OpenAI Batch output is written as the engine answered.

``frame = "polars"`` hands polars DataFrames to both hooks instead (polars must be installed;
it is not a dependency of prefect-swarm).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pyarrow as pa

from prefect_swarm.exceptions import ConfigError, JobError
from prefect_swarm.jobs.api import SwarmJob

POS_COLUMN = "_pos"
"""Column of a polars frame given to ``prepare``: the row's position in the batch (keep it)."""


class DataFrameJob(SwarmJob):
    """A SwarmJob whose rows are prepared, and whose output is finished, as DataFrames (see module doc)."""

    frame: ClassVar[Literal["pandas", "polars"]] = "pandas"
    """DataFrame library the hooks get: ``pandas`` (a dependency) or ``polars`` (when installed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _frame_module(self.frame)  # refuse a missing polars before any request, with the install hint
        self._finish_schema: pa.Schema | None = None

    # ------------------------------------------------------------------ hooks
    def prepare(self, df: Any) -> Any:
        """Before the requests: the batch's input rows -> the rows to send, with the columns ``request`` reads."""
        return df

    def finish(self, df: Any) -> Any:
        """After the answers: the output batch -> the same rows with columns added or changed."""
        return df

    # ------------------------------------------------------------------ plumbing
    def rows(self, batch: pa.RecordBatch) -> list[dict[str, Any] | None]:
        """``prepare`` over the batch; the rows in batch order, None for a row it dropped."""
        out: list[dict[str, Any] | None] = [None] * batch.num_rows
        if self.frame == "polars":
            pl = _frame_module("polars")
            prepared = self.prepare(pl.from_arrow(batch).with_row_index(POS_COLUMN))
            if POS_COLUMN not in prepared.columns:
                raise JobError(f"{type(self).__name__}.prepare dropped the '{POS_COLUMN}' column; keep it.")
            for rec in prepared.to_dicts():
                out[rec.pop(POS_COLUMN)] = rec
            return out
        df = batch.to_pandas()
        df.index = _frame_module("pandas").RangeIndex(len(df), name=POS_COLUMN)  # the framework's row key
        prepared = self.prepare(df)
        if prepared.index.name == POS_COLUMN:
            positions = prepared.index.tolist()
        elif POS_COLUMN in prepared.columns:  # reset_index() moved the key into a column: it still says
            positions = prepared[POS_COLUMN].tolist()
            prepared = prepared.drop(columns=POS_COLUMN)
        else:
            raise JobError(
                f"{type(self).__name__}.prepare replaced the rows' key (the index named '{POS_COLUMN}': "
                f"reset_index(drop=True), set_index, merge...), so which input row each prepared row is cannot "
                f"be told and rows would get each other's answers. Keep the index (filter, sort, assign columns), "
                f"or keep '{POS_COLUMN}' as a column."
            )
        if len(set(positions)) != len(positions) or not all(
            isinstance(p, int) and 0 <= p < len(out) for p in positions
        ):
            raise JobError(
                f"{type(self).__name__}.prepare returned rows that are not the batch's rows, each once (the "
                f"'{POS_COLUMN}' key repeats or is not one of 0..{len(out) - 1}): prepare may drop and reorder rows, "
                "not duplicate or invent them."
            )
        for pos, rec in zip(positions, prepared.to_dict("records"), strict=True):
            out[pos] = rec
        return out

    def finish_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``finish`` over one output batch (internal ``_``-columns kept aside and put back)."""
        internal = [c for c in batch.schema.names if c.startswith("_")]
        visible = batch.drop_columns(internal)
        if self.frame == "polars":
            done = self.finish(_frame_module("polars").from_arrow(visible))
            table = done.to_arrow()
        else:
            done = self.finish(visible.to_pandas())
            table = pa.Table.from_pandas(done, preserve_index=False)
        if table.num_rows != batch.num_rows:
            raise JobError(
                f"{type(self).__name__}.finish returned {table.num_rows} rows for {batch.num_rows}: it must keep "
                "every row, in order (drop rows in prepare, or filter the output afterwards)."
            )
        if self._finish_schema is None:
            self._finish_schema = table.schema.remove_metadata()
        table = table.cast(self._finish_schema)
        names = [*internal, *table.schema.names]
        arrays = [*(batch.column(c) for c in internal), *(c.combine_chunks() for c in table.columns)]
        return pa.RecordBatch.from_arrays(arrays, names=names)


def _frame_module(frame: str) -> Any:
    if frame == "pandas":
        import pandas

        return pandas
    if frame == "polars":
        try:
            import polars
        except ImportError as exc:
            raise ConfigError(
                "DataFrameJob with frame = 'polars' needs polars, which is not installed: pip install polars "
                "(or use frame = 'pandas')."
            ) from exc
        return polars
    raise ConfigError(f"DataFrameJob.frame must be 'pandas' or 'polars', not {frame!r}.")
