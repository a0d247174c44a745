"""(b) peak RSS of the commit of ONE shard at 2M rows / at 200k rows.

    python bench/bench_commit_memory.py [--small 200000] [--large 2000000] [--repeat 1] [--bucket-rows N]

No job runs: the shard's ledger is synthesised with pyarrow in the job process's format (parts of
5,000 rows in shuffled completion order, 5% of the rows written twice, 1% error rows, the
fingerprint, progress and DONE files the commit checks), then ``commit_output`` runs in its own
process pinned to one core; its peak RSS is that process's ``ru_maxrss`` (os.wait4).
``--bucket-rows`` sets ``PREFECT_SWARM_COMMIT_BUCKET_ROWS`` for the commit (a huge value gives one
bucket per shard, i.e. the whole ledger in memory, to compare with).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _common import dataset, median, run_pinned, spec_file

from prefect_swarm.jobs.api import load_job
from prefect_swarm.jobs.checkpoint.fingerprint import job_fingerprint
from prefect_swarm.jobs.checkpoint.ledger import ledger_schema
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.paths import atomic_write_json, atomic_write_text

COMMIT = (
    "import sys; from prefect_swarm.jobs.spec import JobSpec; from prefect_swarm.jobs.rows.commit import "
    "commit_output; commit_output(JobSpec.load(sys.argv[1]))"
)
PART_ROWS = 5000


def fake_ledger(spec: JobSpec, n: int, seed: int = 0) -> None:
    """Shard 0 of 1, finished: ``n`` rows (+5% rewrites) in shuffled parts of ``PART_ROWS`` rows."""
    rng = np.random.default_rng(seed)
    rows = np.concatenate([np.arange(n), rng.choice(n, n // 20, replace=False)])
    rng.shuffle(rows)
    schema = ledger_schema(load_job(spec.job, spec.job_kwargs).outputs, keep_raw=False)
    paths = spec.paths.shard(0)
    paths.root.mkdir(parents=True, exist_ok=True)
    for seq, lo in enumerate(range(0, len(rows), PART_ROWS)):
        r = rows[lo : lo + PART_ROWS]
        ok = rng.random(len(r)) > 0.01
        table = pa.table(
            {
                "_row": r,
                "_id": [f"r{i:08d}" for i in r],
                "status": np.where(ok, "ok", "error"),
                "error": [None if k else "HTTP 500: stub fault" for k in ok],
                "http_status": np.where(ok, 200, 500).astype(np.int16),
                "prompt_tokens": np.full(len(r), 12),
                "completion_tokens": np.full(len(r), 8),
                "latency_ms": np.ones(len(r), dtype=np.float32),
                "attempts": np.ones(len(r), dtype=np.int16),
                "text": [f"stub-{i} answer, a few words" if k else None for i, k in zip(r, ok, strict=True)],
                "finish_reason": ["stop" if k else None for k in ok],
            },
            schema=schema,
        )
        pq.write_table(table, paths.part(seq), compression="zstd")
    fp = job_fingerprint(spec)
    atomic_write_json(paths.fingerprint, {"fingerprint": fp, "shard": 0, "nshards": 1, "start": 0, "end": n})
    atomic_write_json(paths.progress, {"shard": 0, "nshards": 1, "state": "done", "total": n, "done": n})
    atomic_write_text(paths.done_marker, fp)


def one(tmp: Path, src: Path, n: int, env: dict[str, str]) -> dict[str, float]:
    """Synthesise the ledger, commit it; peak RSS (MB) and seconds of the commit."""
    job = tmp / "job"
    shutil.rmtree(job, ignore_errors=True)
    spec_path = spec_file(job, src, "http://127.0.0.1:9", auto_commit=False)
    fake_ledger(JobSpec.load(spec_path), n)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        code, secs, rss = run_pinned([sys.executable, "-c", COMMIT, str(spec_path)])
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert code == 0, code
    out = pq.read_metadata(job / "out.parquet")
    assert out.num_rows == n, out.num_rows
    return {"commit_rss_mb": round(rss / 2**20, 1), "commit_s": round(secs, 1)}


def main() -> None:
    """Print one JSON line per size and the ratio."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=200_000)
    ap.add_argument("--large", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--bucket-rows", type=int, default=None)
    a = ap.parse_args()
    env = {} if a.bucket_rows is None else {"PREFECT_SWARM_COMMIT_BUCKET_ROWS": str(a.bucket_rows)}
    res = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for n in (a.small, a.large):
            src = dataset(tmp / f"in-{n}.parquet", n)
            runs = [one(tmp, src, n, env) for _ in range(a.repeat)]
            res[n] = median([r["commit_rss_mb"] for r in runs])
            print(json.dumps({"rows": n, "runs": runs, "median_commit_rss_mb": res[n]}), flush=True)
    print(json.dumps({"ratio_large_small": round(res[a.large] / res[a.small], 3)}))


if __name__ == "__main__":
    main()
