"""Stages of a pipeline, the data side: what one stage hands to the next.

A pipeline (:func:`prefect_swarm.flows.pipeline`) runs one batch job per stage, each over the stage
before it. Between two stages :func:`hand_over` turns a stage's committed output into the next
stage's input:

- only the rows the stage answered (``status`` ok) go on, and of those only the rows its ``keep``
  filter passes (:class:`RowFilter`);
- the stage's output columns are renamed ``<stage>_<column>`` (``text`` of stage ``generate``
  becomes ``generate_text``): the next stage's prompt template names them (``{generate_text}``) and
  its own outputs (``text`` again) do not collide; the input columns go on as they are;
- the output's bookkeeping columns (status, error, tokens, latency; :data:`RESERVED_COLUMNS`) are
  dropped: the stage's summary has the counts.

The last stage's hand-over is the pipeline's output. Streamed batch by batch: never the whole
output in memory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from prefect_swarm.exceptions import ConfigError
from prefect_swarm.jobs.api import SwarmJob
from prefect_swarm.jobs.columns import RESERVED_COLUMNS
from prefect_swarm.jobs.rows import storage

STATUS_OK = "ok"
BATCH_ROWS = 65_536
"""Rows read and written at a time by a hand-over."""
STAGE_NAME = r"^[a-z][a-z0-9_]{0,31}$"
"""What a stage's name may be: it prefixes its output columns (``<name>_text``)."""


class RowFilter(BaseModel):
    """Which answered rows of a stage go on: those whose ``column`` passes ONE test (``equals``,
    ``one_of`` or ``matches``). A null value never passes (negated or not); a row that failed never
    goes on. Example: ``{"column": "verdict", "equals": "pass"}``."""

    model_config = ConfigDict(extra="forbid")

    column: str = Field(
        min_length=1,
        description="A column of the stage's output as the stage wrote it: one of its outputs ('text', a "
        "response schema field) or a column of its input.",
    )
    equals: str | int | float | bool | None = Field(default=None, description="Keep the rows whose value equals this.")
    one_of: list[str | int | float | bool] | None = Field(
        default=None, description="Keep the rows whose value is one of these."
    )
    matches: str | None = Field(
        default=None,
        description="Keep the rows whose value, as text, contains a match of this regular expression (Python "
        "re.search: '^pass$' for the whole value, '(?i)' for any case).",
    )
    negate: bool = Field(default=False, description="Keep the rows that do NOT pass the test instead.")

    @model_validator(mode="after")
    def _one_test(self) -> RowFilter:
        given = [k for k in ("equals", "one_of", "matches") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"keep: give exactly one of equals, one_of, matches (got {', '.join(given) or 'none'}), e.g. "
                '{"column": "verdict", "equals": "pass"}.'
            )
        if self.matches is not None:
            try:
                re.compile(self.matches)
            except re.error as exc:
                raise ValueError(f"keep.matches {self.matches!r} is not a regular expression: {exc}.") from None
        return self

    def describe(self) -> str:
        """The filter in one line: ``verdict == 'pass'``."""
        if self.equals is not None:
            test = f"== {self.equals!r}"
        elif self.one_of is not None:
            test = f"in {self.one_of!r}"
        else:
            test = f"~ /{self.matches}/"
        return f"{'not ' if self.negate else ''}{self.column} {test}"

    def passes(self, values: Sequence[Any]) -> list[bool]:
        """For each value, whether its row goes on."""
        if self.matches is not None:
            pattern = re.compile(self.matches)
            test = lambda v: pattern.search(v if isinstance(v, str) else str(v)) is not None  # noqa: E731
        elif self.one_of is not None:
            allowed = self.one_of
            test = lambda v: v in allowed  # noqa: E731
        else:
            wanted = self.equals
            test = lambda v: v == wanted  # noqa: E731
        return [v is not None and test(v) != self.negate for v in values]


@dataclass(frozen=True)
class HandOver:
    """What a hand-over read and wrote."""

    rows: int
    """Rows of the stage's output."""
    answered: int
    """Of those, rows the stage answered (status ok)."""
    kept: int
    """Of those, rows its filter passed: the rows that went on."""


def outputs_of(job: SwarmJob, output_columns: Sequence[str] | None) -> list[str]:
    """The output columns a stage's job writes (all of the job's, or those ``output_columns`` names)."""
    return [c for c in job.outputs if output_columns is None or c in output_columns]


def renamed(stage: str, columns: Sequence[str], outputs: Sequence[str]) -> list[tuple[str, str]]:
    """(name in the stage's output, name in its hand-over) for each column that goes on: the input
    columns as they are, the stage's outputs as ``<stage>_<column>``, no bookkeeping column."""
    pairs = [(c, f"{stage}_{c}" if c in outputs else c) for c in columns if c not in RESERVED_COLUMNS]
    seen: dict[str, str] = {}
    for old, new in pairs:
        if new in seen:
            raise ConfigError(
                f"stage {stage}: its output '{old}' would become column '{new}', which its input already has. "
                "Rename the stage (its name prefixes its outputs) or that input column."
            )
        seen[new] = old
    return pairs


def check_stage(
    stage: str,
    job: SwarmJob,
    available: Sequence[str],
    *,
    id_column: str | None = None,
    input_columns: Sequence[str] | None = None,
    output_columns: Sequence[str] | None = None,
    keep: RowFilter | None = None,
) -> list[str]:
    """Refuse a stage whose job, id column or filter names a column it will not have (before any
    swarm is brought up); return the columns of its hand-over (what the next stage gets).

    ``available``: the columns of the stage's input (the pipeline's input for the first stage, the
    previous hand-over's after it)."""
    needed = [*job.all_columns(), *([id_column] if id_column else []), *(input_columns or [])]
    missing = [c for c in needed if c not in available]
    if missing:
        raise ConfigError(
            f"stage {stage}: column(s) {', '.join(repr(c) for c in missing)} are not among the columns it gets "
            f"({', '.join(available)}). An earlier stage's outputs are named <stage>_<column> "
            "(e.g. generate_text): name them so in the prompt_template."
        )
    outputs = outputs_of(job, output_columns)
    kept_inputs = list(input_columns) if input_columns is not None else list(available)
    columns = [*kept_inputs, *outputs]
    if keep is not None and keep.column not in columns:
        raise ConfigError(
            f"stage {stage}: keep.column '{keep.column}' is not a column of its output ({', '.join(columns)}). "
            "Name one of its outputs as the stage writes it (e.g. 'verdict', not 'judge_verdict')."
        )
    return [new for _, new in renamed(stage, columns, outputs)]


def hand_over(
    source: str | Path, dest: str, *, stage: str, outputs: Sequence[str], keep: RowFilter | None = None
) -> HandOver:
    """Write the rows of stage ``stage``'s committed output ``source`` (one parquet file) that go on
    to ``dest`` (a parquet file: local path, or ``s3://``/``gs://``; written whole or not at all),
    with its ``outputs`` renamed (:func:`renamed`)."""
    pf = pq.ParquetFile(source)
    names = pf.schema_arrow.names
    if "status" not in names:
        raise ConfigError(f"stage {stage}: {source} has no 'status' column: it is not a job's committed output.")
    if keep is not None and keep.column not in names:
        raise ConfigError(
            f"stage {stage}: keep.column '{keep.column}' is not a column of {source} ({', '.join(names)})."
        )
    pairs = renamed(stage, names, outputs)
    schema = pa.schema([pf.schema_arrow.field(old).with_name(new) for old, new in pairs])
    rows = answered = kept = 0
    with storage.publish_file(storage.parse(dest, "output")) as sink:
        writer = pq.ParquetWriter(str(sink) if isinstance(sink, Path) else sink, schema)
        try:
            for batch in pf.iter_batches(batch_size=BATCH_ROWS):
                mask = pc.fill_null(pc.equal(batch.column("status"), STATUS_OK), False)
                rows += batch.num_rows
                answered += pc.sum(mask).as_py() or 0
                if keep is not None:
                    mask = pc.and_(mask, pa.array(keep.passes(batch.column(keep.column).to_pylist())))
                chosen = batch.filter(mask)
                kept += chosen.num_rows
                writer.write_batch(pa.RecordBatch.from_arrays([chosen.column(old) for old, _ in pairs], schema=schema))
        finally:
            writer.close()
    return HandOver(rows, answered, kept)
