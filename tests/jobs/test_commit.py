"""The commit's bucketed external sort: same output as one in-memory bucket, whatever the bucket size."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from _jobkit import make_dataset, write_spec

from prefect_swarm.exceptions import ConfigError, JobError
from prefect_swarm.jobs.api import load_job
from prefect_swarm.jobs.checkpoint.fingerprint import job_fingerprint
from prefect_swarm.jobs.checkpoint.ledger import ledger_schema
from prefect_swarm.jobs.rows.commit import commit_output
from prefect_swarm.jobs.rows.input import shard_range
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import atomic_write_json, atomic_write_text


def _fake_ledger(spec: JobSpec, n: int, seed: int) -> dict[int, dict[str, Any]]:
    """Shuffled part files with rewritten rows for every shard (as a finished job leaves them).

    Returns the last write of each row (what the output must hold).
    """
    rng = random.Random(seed)
    schema = ledger_schema(load_job(spec.job, spec.job_kwargs).outputs, keep_raw=False)
    fp = job_fingerprint(spec)
    latest: dict[int, dict[str, Any]] = {}
    for i in range(spec.shards):
        start, end = shard_range(n, i, spec.shards)
        writes = []
        for row in range(start, end):
            for attempt in range(rng.choice([1, 1, 1, 2, 3])):  # rewritten rows: retries, reruns
                ok = rng.random() > 0.2
                writes.append(
                    {
                        "_row": row,
                        "_id": f"r{row:06d}",
                        "status": "ok" if ok else "error",
                        "error": None if ok else f"HTTP 500 on try {attempt}",
                        "http_status": 200 if ok else 500,
                        "prompt_tokens": rng.randint(1, 9),
                        "completion_tokens": rng.randint(1, 9),
                        "latency_ms": 1.0,
                        "attempts": 1,
                        "text": f"answer {row}.{attempt}" if ok else None,
                        "finish_reason": "stop" if ok else None,
                    }
                )
        rng.shuffle(writes)  # completion order
        paths = spec.paths.shard(i)
        paths.root.mkdir(parents=True, exist_ok=True)
        seq = k = 0
        while k < len(writes):
            chunk = writes[k : k + rng.randint(1, 400)]
            pq.write_table(pa.Table.from_pylist(chunk, schema=schema), paths.part(seq))
            for w in chunk:
                latest[w["_row"]] = w
            seq, k = seq + 1, k + len(chunk)
        atomic_write_json(paths.fingerprint, {"fingerprint": fp, "shard": i, "start": start, "end": end})
        atomic_write_text(paths.done_marker, fp)
    return latest


@pytest.fixture
def job(tmp_path: Path) -> tuple[JobSpec, dict[int, dict[str, Any]]]:
    n = 3000
    make_dataset(tmp_path / "in.parquet", n, row_group=700)
    spec = JobSpec.load(write_spec(tmp_path, shards=2, endpoints=["http://127.0.0.1:9"]))
    return spec, _fake_ledger(spec, n, seed=5)


def test_tiny_buckets_match_one_bucket_and_the_last_writes(job, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, latest = job
    out = Path(spec.output)
    tiny = commit_output(spec, bucket_rows=7, open_buckets=4)  # 3000 rows / 7 per bucket: many passes per shard
    small = pq.read_table(out)
    assert not list(spec.paths.root.glob(".commit-buckets-*"))  # temp buckets removed
    failed_small = spec.paths.failed_rows.read_text()
    one = commit_output(spec, force=True, bucket_rows=10**9)  # one bucket per shard: the in-memory merge
    assert pq.read_table(out).equals(small)
    assert spec.paths.failed_rows.read_text() == failed_small
    monkeypatch.setenv("PREFECT_SWARM_COMMIT_BUCKET_ROWS", "13")
    commit_output(spec, force=True)
    assert pq.read_table(out).equals(small)

    rows = small.to_pylist()
    assert [r["id"] for r in rows] == [f"r{i:06d}" for i in range(3000)]
    assert rows[5]["prompt"] == "question number 5 about topic 5"
    for r, k in zip(rows, range(3000), strict=True):
        w = latest[k]
        assert (r["status"], r["error"], r["text"], r["finish_reason"]) == (
            w["status"],
            w["error"],
            w["text"],
            w["finish_reason"],
        )
        assert (r["prompt_tokens"], r["completion_tokens"]) == (w["prompt_tokens"], w["completion_tokens"])
    errors = [w for _, w in sorted(latest.items()) if w["status"] == "error"]
    assert [json.loads(line) for line in failed_small.splitlines()] == [
        {"id": w["_id"], "error": w["error"]} for w in errors
    ]
    for m in (tiny, one):
        assert (m["rows"], m["failed"], m["ok"]) == (3000, len(errors), 3000 - len(errors))
        assert m["completion_tokens"] == sum(w["completion_tokens"] for w in latest.values())


def test_unchanged_ledger_returns_the_manifest(job) -> None:
    spec, _ = job
    first = commit_output(spec, bucket_rows=50)
    assert commit_output(spec, bucket_rows=50) == first


def test_missing_row_is_refused_and_output_kept(job) -> None:
    spec, _ = job
    commit_output(spec, bucket_rows=100)
    before = Path(spec.output).read_bytes()
    paths = spec.paths.shard(1)
    for part in paths.parts():  # drop row 2000 from every part
        table = pq.read_table(part)
        pq.write_table(table.filter(pc.not_equal(table.column("_row"), 2000)), part)
    with pytest.raises(JobError, match="shard 1 ledger lacks row 2000"):
        commit_output(spec, force=True, bucket_rows=100)
    assert Path(spec.output).read_bytes() == before
    assert not list(spec.paths.root.glob(".commit-buckets-*"))


def test_bad_bucket_knob_is_refused(job, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, _ = job
    monkeypatch.setenv("PREFECT_SWARM_COMMIT_BUCKET_ROWS", "lots")
    with pytest.raises(ConfigError, match="PREFECT_SWARM_COMMIT_BUCKET_ROWS='lots': Input should be a valid integer"):
        commit_output(spec)
