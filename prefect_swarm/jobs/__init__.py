"""The job engine (data plane): job API, spec, runner, ledger, commit, and submission helpers.

    api.py / builtin.py   SwarmJob and the built-in jobs (row -> request, response -> columns)
    spec.py               JobSpec (the JSON file every job process reads)
    dataset.py            input: open, validate, stream a row range
    runner.py             async aiohttp runner: concurrency, retries, endpoints
    ledger.py             per-shard checkpoint (part files, progress, fingerprint, DONE)
    cache.py              identical requests sent once; the response cache across jobs
    shard.py / run.py     the job process (`python -m prefect_swarm.jobs.run`)
    plan.py               pending shards, progress
    commit.py             merge shards into the output; manifest; failed rows
    submit.py             prepare / submit / status / wait / cancel through a compute backend

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
