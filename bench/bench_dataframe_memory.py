"""Peak RSS of a DataFrameJob (examples/dataframe_job.py:TicketTriage) at 1M rows / at 100k rows.

    python bench/bench_dataframe_memory.py [--small 100000] [--large 1000000]

Both hooks run on bounded batches: ``prepare`` (pandas) on each input batch in the job process,
``finish`` (pandas) on each output batch in the commit. The job process (auto-commit off) and the
commit are measured separately, each pinned to one core, peak RSS = its ``ru_maxrss``; the stub
engine answers at 0 ms. Prints one JSON line per size and the ratios (goal <= 1.3).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from _common import ROOT, job_argv, run_pinned, spec_file

from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine

COMMIT = (
    "import sys; from prefect_swarm.jobs.spec import JobSpec; from prefect_swarm.jobs.rows.commit import "
    "commit_output; commit_output(JobSpec.load(sys.argv[1]))"
)
SUBJECTS = ["login fails", "site down", "invoice question", "urgent: data loss", "feature idea"]


def tickets(path: Path, n: int, chunk: int = 100_000) -> Path:
    """``n`` tickets (ticket, subject, body; every 10th body empty), written in chunks."""
    schema = pa.schema([("ticket", pa.int64()), ("subject", pa.string()), ("body", pa.string())])
    with pq.ParquetWriter(path, schema) as w:
        for lo in range(0, n, chunk):
            idx = range(lo, min(n, lo + chunk))
            cols = {
                "ticket": list(idx),
                "subject": [SUBJECTS[i % 5] for i in idx],
                "body": ["" if i % 10 == 9 else f"details of ticket {i}, seen since monday" for i in idx],
            }
            w.write_table(pa.table(cols, schema=schema), row_group_size=50_000)
    return path


def one(tmp: Path, n: int, url: str) -> dict[str, float]:
    """Job process and commit of ``n`` rows: seconds and peak RSS (MB) of each."""
    src = tickets(tmp / f"in-{n}.parquet", n)
    job = tmp / f"job-{n}"
    spec = spec_file(job, src, url, id_column="ticket", job="dataframe_job:TicketTriage", auto_commit=False)
    code, job_s, job_rss = run_pinned(job_argv(spec))
    assert code == 0, code
    code, commit_s, commit_rss = run_pinned([sys.executable, "-c", COMMIT, str(spec)])
    assert code == 0, code
    assert pq.read_metadata(job / "out.parquet").num_rows == n
    return {
        "rows": n,
        "job_s": round(job_s, 1),
        "job_rss_mb": round(job_rss / 2**20, 1),
        "commit_s": round(commit_s, 1),
        "commit_rss_mb": round(commit_rss / 2**20, 1),
    }


def main() -> None:
    """Print one JSON line per size and the ratios large/small."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--large", type=int, default=1_000_000)
    a = ap.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "examples"), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as d, StubEngine(free_port(), cpu=0) as stub:
        small, large = (one(Path(d), n, stub.url) for n in (a.small, a.large))
        for r in (small, large):
            print(json.dumps(r), flush=True)
    ratios = {k: round(large[k] / small[k], 3) for k in ("job_rss_mb", "commit_rss_mb")}
    print(json.dumps({"ratio_large_small": ratios}))


if __name__ == "__main__":
    main()
