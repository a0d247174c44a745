"""Pipeline tasks: hand one stage's output to the next (:func:`hand_over`), publish the summary.

The data work is :mod:`prefect_swarm.jobs.stages`'s; these add the run logger, a stamp that keeps a
hand-over as it is while its source has not changed, and the artifacts.

The stamp matters for exactly-once: the next stage's job is identified by its input's identity
(path, size, mtime; :mod:`prefect_swarm.jobs.checkpoint.fingerprint`). A rerun after a crash finds the stamp
of the same source and filter and leaves the hand-over untouched, so the next stage's job id and
ledger are the same and it resumes; a source that changed (the earlier stage re-answered rows) makes
a new hand-over, and the next stage a new job over it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from prefect_swarm.jobs.rows import storage
from prefect_swarm.jobs.stages import HandOver, RowFilter, hand_over
from prefect_swarm.paths import PipelinePaths, atomic_write_json, read_json
from prefect_swarm.tasks.artifacts import _table, artifact_key


def _identity(path: Path) -> dict[str, Any]:
    st = os.stat(path)
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


@task(name="hand-over", task_run_name="hand-over-{stage}", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def hand_over_stage(
    paths: PipelinePaths,
    stage: str,
    source: Path,
    dest: str,
    outputs: list[str],
    keep: RowFilter | None = None,
) -> HandOver:
    """Write to ``dest`` the rows of stage ``stage``'s output ``source`` that go on (answered, passed
    by ``keep``), its ``outputs`` renamed ``<stage>_<column>``; kept as it is when already made from
    the same source, filter and columns (its stamp in ``paths``)."""
    log = get_run_logger()
    made_from = {
        "source": _identity(source),
        "dest": storage.parse(dest, "output").uri,
        "stage": stage,
        "outputs": outputs,
        "keep": keep.model_dump() if keep is not None else None,
    }
    stamp = paths.stamp(dest)
    old = read_json(stamp)
    if old is not None and old.get("made_from") == made_from and storage.parse(dest, "output").exists():
        counts = HandOver(**old["counts"])
        log.info("Stage %s: %s already holds its %d rows that went on (unchanged source).", stage, dest, counts.kept)
        return counts
    counts = hand_over(source, dest, stage=stage, outputs=outputs, keep=keep)
    atomic_write_json(stamp, {"made_from": made_from, "counts": counts.__dict__})
    log.info(
        "Stage %s: %d rows, %d answered, %d went on%s -> %s.",
        stage,
        counts.rows,
        counts.answered,
        counts.kept,
        f" (keep: {keep.describe()})" if keep is not None else "",
        dest,
    )
    return counts


def publish_pipeline_summary(pipeline_id: str, output: str, rows: list[dict[str, Any]], totals: dict[str, Any]) -> None:
    """A table artifact (one row per stage) under ``<pipeline id>-summary``, and a report naming the output."""
    create_table_artifact(
        key=artifact_key(pipeline_id, "summary"), table=rows, description=f"pipeline {pipeline_id}: one row per stage"
    )
    lines = [
        f"# Pipeline `{pipeline_id}`",
        "",
        f"Output: `{output}` ({totals['rows']} rows)",
        "",
        *_table(rows),
        "",
        *_table([totals]),
    ]
    create_markdown_artifact(
        key=artifact_key(pipeline_id, "report"),
        markdown="\n".join(lines),
        description=f"pipeline {pipeline_id}: report",
    )
