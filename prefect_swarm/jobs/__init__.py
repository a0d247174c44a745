"""The job engine (data plane), in rooms named for what happens to a row.

    spec.py               JobSpec (the JSON file every job process reads)
    api.py / builtin.py   SwarmJob and the built-in jobs (row -> request, response -> columns);
                          dataframe.py, stages.py, structured.py, template.py, images.py beside them
    columns.py            the output's own columns (status, error, tokens, ...)
    shard.py / run.py     the job process (`python -m prefect_swarm.jobs.run`)
    rows/                 where rows come from and go to: input, output (the output check), storage, commit
    checkpoint/           ledger (per-shard finished rows), fingerprint, plan (pending shards), failures
    dispatch/             how rows reach replicas: runner, control (in-flight), ratelimit, cache, metrics

Nothing here imports prefect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_swarm import lazy_names

if TYPE_CHECKING:
    from prefect_swarm.jobs.api import BUILTIN_JOBS, SwarmJob, load_job
    from prefect_swarm.jobs.builtin import ChatCompletionJob, CompletionJob, EmbeddingJob, OpenAIBatchJob
    from prefect_swarm.jobs.spec import JobSpec

_WHERE = {
    **dict.fromkeys(["BUILTIN_JOBS", "SwarmJob", "load_job"], "prefect_swarm.jobs.api"),
    **dict.fromkeys(
        ["ChatCompletionJob", "CompletionJob", "EmbeddingJob", "OpenAIBatchJob"], "prefect_swarm.jobs.builtin"
    ),
    "JobSpec": "prefect_swarm.jobs.spec",
}

__all__ = [
    "BUILTIN_JOBS",
    "ChatCompletionJob",
    "CompletionJob",
    "EmbeddingJob",
    "JobSpec",
    "OpenAIBatchJob",
    "SwarmJob",
    "load_job",
]

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
