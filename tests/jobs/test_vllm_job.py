"""A real vLLM (CPU build, tiny model) the suite started itself: an 800-row chat job in 4 shards, samples."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import services
from _jobkit import job_argv, make_dataset, write_spec

from prefect_swarm.paths import JobPaths, read_json
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture
def vllm_env(vllm_server: tuple[str, subprocess.Popen[bytes]]) -> dict[str, str]:
    """A job process's environment for the suite's shared vLLM server: its URL and its API key."""
    return {**os.environ, "PREFECT_SWARM_ENDPOINTS": vllm_server[0], "PREFECT_SWARM_API_KEY": services.VLLM_KEY}


@pytest.mark.smoke
def test_chat_job_800_rows_4_shards_on_vllm(tmp_path: Path, vllm_env: dict[str, str]) -> None:
    """Each shard's 200 rows span two row groups of the input; the rerun takes every answer from the cache."""
    n = 800
    make_dataset(tmp_path / "in.parquet", n, row_group=120)
    fields = {
        "model": "tiny",
        "concurrency": 16,
        "shards": 4,
        "job_kwargs": {"system_prompt": "Answer briefly.", "sampling": {"max_tokens": 4, "temperature": 0}},
        # the response cache (jobs.cache) keeps vLLM's answers for the rerun below
        "cache": True,
        "cache_dir": str(tmp_path / "cache"),
        "swarm_fingerprint": "vllm-tiny",
    }
    spec = write_spec(tmp_path, **fields)
    started = time.monotonic()
    procs = [subprocess.Popen(job_argv(spec, i, 4), env=vllm_env, stderr=subprocess.PIPE, text=True) for i in range(4)]
    codes = [p.wait(600) for p in procs]
    assert codes == [0, 0, 0, 0], [p.stderr.read()[-2000:] for p in procs if p.stderr]
    elapsed = time.monotonic() - started
    rows = pq.read_table(tmp_path / "job-out.parquet").to_pylist()
    assert len(rows) == n
    assert [r["id"] for r in rows] == [f"r{i:06d}" for i in range(n)]
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows if r["status"] != "ok"][:3]
    assert all(r["prompt_tokens"] > 0 and 0 < r["completion_tokens"] <= 4 for r in rows)
    assert all(isinstance(r["text"], str) and r["finish_reason"] in ("length", "stop") for r in rows)
    print(
        f"vLLM: {n} rows, 4 shards in {elapsed:.1f}s; tokens "
        f"{sum(r['prompt_tokens'] for r in rows)}+{sum(r['completion_tokens'] for r in rows)}"
    )
    # another job over the same rows on the same engine: every answer comes from the cache, none is sent
    again = write_spec(tmp_path, "again", **fields)
    procs = [subprocess.Popen(job_argv(again, i, 4), env=vllm_env, stderr=subprocess.PIPE, text=True) for i in range(4)]
    assert [p.wait(600) for p in procs] == [0, 0, 0, 0], [p.stderr.read()[-2000:] for p in procs if p.stderr]
    progress = [read_json(JobPaths(tmp_path / "again").shard(i).progress) for i in range(4)]
    assert sum(p["requests"] for p in progress) == 0 and sum(p["cache_hits"] for p in progress) == n
    columns = ["id", "status", "text", "finish_reason"]
    out, first = pq.read_table(tmp_path / "again-out.parquet"), pq.read_table(tmp_path / "job-out.parquet")
    assert out.select(columns).equals(first.select(columns))


def test_four_samples_per_row_on_vllm_exactly_once_across_a_kill(tmp_path: Path, vllm_env: dict[str, str]) -> None:
    """``samples: 4`` is one request with ``n=4`` per row; vLLM answers 4 choices; a kill -9 once the
    first checkpoint is on disk and a rerun leave each row once, with 4 answers."""
    import signal

    from prefect_swarm.paths import JobPaths

    n = 300
    make_dataset(tmp_path / "in.parquet", n)
    spec = write_spec(
        tmp_path, model="tiny", concurrency=8, checkpoint_every=20, checkpoint_seconds=0.5,
        job_kwargs={"samples": 4, "sampling": {"max_tokens": 4, "temperature": 1.0, "seed": 7}},
    )  # fmt: skip
    proc = subprocess.Popen(job_argv(spec), env=vllm_env, stderr=subprocess.DEVNULL)
    shard = JobPaths(tmp_path / "job").shard(0)
    wait_until(
        "a checkpoint (or the job's end)",
        lambda: (shard.parts(), proc.poll()),
        until=lambda seen: seen[0] or seen[1] is not None,
        timeout_s=300,
        poll_s=0.1,
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rerun = subprocess.run(job_argv(spec), env=vllm_env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    rows = pq.read_table(tmp_path / "job-out.parquet").to_pylist()
    assert [r["id"] for r in rows] == [f"r{i:06d}" for i in range(n)]
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows if r["status"] != "ok"][:3]
    assert all(len(r["text"]) == 4 and len(r["finish_reason"]) == 4 for r in rows)
    assert all(4 <= r["completion_tokens"] <= 16 for r in rows)  # the usage covers the 4 answers
    assert sum(len(set(r["text"])) > 1 for r in rows) > n // 2  # sampled, not one answer copied 4 times


def test_four_samples_per_row_as_seeded_requests_on_vllm(tmp_path: Path, vllm_env: dict[str, str]) -> None:
    """``samples_by: seeds`` (what ``auto`` falls back to on an engine without ``n``) against the real
    engine: 4 requests per row, each with its own seed; each row's prompt paid for 4 times."""
    n = 40
    make_dataset(tmp_path / "in.parquet", n)
    sampling = {"max_tokens": 4, "temperature": 1.0, "seed": 7}
    for name, kwargs in (("one", {"sampling": sampling}), ("seeds", {"samples": 4, "samples_by": "seeds",
                                                                       "sampling": sampling})):  # fmt: skip
        spec = write_spec(tmp_path, name, model="tiny", concurrency=8, job_kwargs=kwargs)
        res = subprocess.run(job_argv(spec), env=vllm_env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
    one = pq.read_table(tmp_path / "one-out.parquet").to_pylist()
    rows = pq.read_table(tmp_path / "seeds-out.parquet").to_pylist()
    assert all(r["status"] == "ok" and len(r["text"]) == 4 for r in rows), [r["error"] for r in rows][:3]
    assert [r["prompt_tokens"] for r in rows] == [4 * r["prompt_tokens"] for r in one]
    assert all(4 <= r["completion_tokens"] <= 16 for r in rows)
    assert sum(len(set(r["text"])) > 1 for r in rows) > n // 2  # four seeds, not one answer copied
