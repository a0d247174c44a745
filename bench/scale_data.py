"""Scale of the job engine's bookkeeping at 1M, 4M and 16M rows: commit, resume, memory, part files.

    python bench/scale_data.py [--sizes 1000000,4000000,16000000] [--tmp DIR]

Per size N, on one parquet input of N rows (id, prompt; 100k-row row groups) and one shard:

- **submitter**: ``validate_input`` (footers, null check, id uniqueness) then ``pending_shards`` and
  ``job_progress`` in a fresh process: its wall time and peak RSS. Every peak RSS here is the
  process's own ``VmHWM`` (/proc/self/status, written at exit): ``ru_maxrss`` of a child starts at
  its parent's size at fork, and this process grows while it builds the ledgers.
- **ledger at 90 %**: a synthetic ledger (the stub engine at 0 ms would take minutes per size on a
  loaded 2-core machine): 0.9 N rows (1 % error rows) in checkpoint parts of 20,000 rows, written
  through the ledger's own part path (:meth:`ShardLedger.append_part`: part, index, progress,
  size-tiered compaction); the last part is left out of the index, as a kill -9 between a part and
  its index leaves it. Reported: part files on disk, and the seconds that took.
- **resume**: the real job process (``python -m prefect_swarm.jobs.run``) against a stub engine at
  0 ms: seconds from its start to the stub's first request (polled every 20 ms; mostly imports and
  the runner's start on a loaded machine), then SIGTERM after 2 s of running; its peak RSS. And, in
  this process, the part of it that depends on the ledger: ``ShardRun`` (input opened from the kept
  metadata), ``ledger.open()`` and the first request body built (``resume_open_s``); the same with
  the index deleted, i.e. every part replayed one at a time (``resume_open_noindex_s``).
- **commit**: the rest of the rows appended, DONE written, then ``commit_output`` in a fresh process
  (whatever commit the tree has: a single ``.parquet`` file output): wall time and peak RSS.

Prints one JSON line per size, then the ratios of the largest size to the smallest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from _common import ROOT, dataset, job_argv, spec_file

from prefect_swarm.jobs.api import load_job
from prefect_swarm.jobs.dataset import open_input
from prefect_swarm.jobs.fingerprint import fingerprint_details, hash_details
from prefect_swarm.jobs.ledger import ShardLedger
from prefect_swarm.jobs.shard import ShardRun
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.testing import free_port
from prefect_swarm.testing.stub_engine import StubEngine

PART_ROWS = 20_000
HWM = (
    "import atexit, os; atexit.register(lambda: open(os.environ['BENCH_HWM'], 'w').write("
    "next(ln for ln in open('/proc/self/status') if ln.startswith('VmHWM'))))"
)
"""Prepended to each measured process: its peak RSS (VmHWM) to the file ``$BENCH_HWM`` at exit."""
SUBMIT = HWM + (
    "; import sys; from prefect_swarm.jobs.spec import JobSpec; from prefect_swarm.jobs.shard import validate_input; "
    "from prefect_swarm.jobs.plan import pending_shards, job_progress; s = JobSpec.load(sys.argv[1]); "
    "validate_input(s); pending_shards(s); job_progress(s)"
)
COMMIT = HWM + (
    "; import sys; from prefect_swarm.jobs.spec import JobSpec; from prefect_swarm.jobs.commit import "
    "commit_output; commit_output(JobSpec.load(sys.argv[1]))"
)
SHARD = (
    HWM + "; import sys, runpy; sys.argv[0] = 'run'; runpy.run_module('prefect_swarm.jobs.run', run_name='__main__')"
)


def hwm_env(tmp: Path) -> dict[str, str]:
    """The environment of a measured process (see :data:`HWM`)."""
    (tmp / "hwm").unlink(missing_ok=True)
    return {**os.environ, "BENCH_HWM": str(tmp / "hwm")}


def read_hwm(tmp: Path) -> float:
    """The peak RSS (MB) the last measured process wrote."""
    return int((tmp / "hwm").read_text().split()[1]) / 1024


def run_measured(argv: list[str], tmp: Path) -> tuple[int, float, float]:
    """(exit code, wall seconds, peak RSS MB) of ``argv``."""
    t0 = time.monotonic()
    code = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=hwm_env(tmp))
    return code.returncode, time.monotonic() - t0, read_hwm(tmp)


def ledger_rows(schema: pa.Schema, lo: int, hi: int, outputs: list[str]) -> pa.Table:
    """Rows ``[lo, hi)`` as the job process writes them (1 % errors)."""
    rows = np.arange(lo, hi, dtype=np.int64)
    ok = rows % 100 != 7
    num = pa.array(rows).cast(pa.string())
    data: dict[str, Any] = {
        "_row": rows,
        "_id": pc.binary_join_element_wise("r", num, ""),
        "status": np.where(ok, "ok", "error"),
        "error": pa.array(np.where(ok, None, "HTTP 500: stub fault")),
        "http_status": np.where(ok, 200, 500).astype(np.int16),
        "prompt_tokens": np.full(rows.size, 12),
        "completion_tokens": np.full(rows.size, 8),
        "latency_ms": np.ones(rows.size, dtype=np.float32),
        "attempts": np.ones(rows.size, dtype=np.int16),
    }
    for name in outputs:
        typ = schema.field(name).type
        text = pa.types.is_string(typ)
        data[name] = pc.binary_join_element_wise("answer ", num, "") if text else pa.nulls(rows.size, typ)
    return pa.table({k: data[k] for k in schema.names}, schema=schema)


def open_ledger(spec: JobSpec, n: int) -> ShardLedger:
    ds = open_input(spec)
    details = fingerprint_details(spec, ds)
    job = load_job(spec.job, spec.job_kwargs)
    led = ShardLedger(
        spec.paths.shard(0),
        shard=0,
        nshards=1,
        start=0,
        end=n,
        fingerprint=hash_details(details),
        details=details,
        outputs=job.outputs,
    )
    led.open()
    return led


def build_ledger(spec: JobSpec, n: int, upto: int) -> tuple[ShardLedger, float]:
    """Rows ``[0, upto)`` through the ledger's part path; the last part not indexed."""
    t0 = time.monotonic()
    led = open_ledger(spec, n)
    outputs = list(load_job(spec.job, spec.job_kwargs).outputs)
    for lo in range(0, upto, PART_ROWS):
        hi = min(upto, lo + PART_ROWS)
        led.append_part(ledger_rows(led.schema, lo, hi, outputs), index=hi < upto)
    return led, time.monotonic() - t0


def first_request(spec_path: Path, stub: StubEngine, tmp: Path) -> tuple[float, float, int]:
    """(seconds to the first request, peak RSS MB, exit code) of the resumed job process."""
    before = stub.stats().get("requests", 0)
    t0 = time.monotonic()
    argv = [sys.executable, "-c", SHARD, *job_argv(spec_path)[3:]]
    env = hwm_env(tmp)
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    first = float("nan")
    while proc.poll() is None and time.monotonic() - t0 < 300:
        if stub.stats().get("requests", 0) > before:
            first = time.monotonic() - t0
            break
        time.sleep(0.02)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    return first, read_hwm(tmp) if proc.wait() == 75 else float("nan"), proc.returncode


def open_to_first_item(spec: JobSpec) -> float:
    """Seconds from a fresh ShardRun to its first request body (input metadata, ledger open, first rows)."""
    t0 = time.monotonic()
    run = ShardRun(spec, 0, 1)
    run.ledger.open()
    next(run._items(spec.model))
    return time.monotonic() - t0


def one(tmp: Path, n: int, stub: StubEngine) -> dict[str, Any]:
    src = dataset(tmp / f"in-{n}.parquet", n, row_group=100_000)
    job_dir = tmp / f"job-{n}"
    shutil.rmtree(job_dir, ignore_errors=True)
    spec_path = spec_file(job_dir, src, stub.url, auto_commit=False, checkpoint_every=20_000)
    spec = JobSpec.load(spec_path)
    code, submit_s, submit_rss = run_measured([sys.executable, "-c", SUBMIT, str(spec_path)], tmp)
    assert code == 0, f"submitter exit {code}"
    upto = n * 9 // 10
    led, build_s = build_ledger(spec, n, upto)
    parts = len(spec.paths.shard(0).parts())
    open_s = open_to_first_item(spec)
    index = spec.paths.shard(0).index
    saved = index.read_bytes()
    index.unlink()
    open_noindex_s = open_to_first_item(spec)
    index.write_bytes(saved)
    resume_s, shard_rss, code = first_request(spec_path, stub, tmp)
    assert code == 75, f"resumed shard exit {code}"
    led = open_ledger(spec, n)  # what the resumed process left; the rest of the rows, then DONE
    outputs = list(load_job(spec.job, spec.job_kwargs).outputs)
    missing = led.seen.missing(0, n)
    lo = int(missing[0]) if missing.size else n
    for a in range(lo, n, PART_ROWS):
        led.append_part(ledger_rows(led.schema, a, min(n, a + PART_ROWS), outputs))
    assert led.complete, "ledger incomplete"
    led.flush("done")
    led.mark_done()
    parts_done = len(spec.paths.shard(0).parts())
    code, commit_s, commit_rss = run_measured([sys.executable, "-c", COMMIT, str(spec_path)], tmp)
    assert code == 0, f"commit exit {code}"
    out_rows = pq.read_metadata(spec.output).num_rows if Path(spec.output).is_file() else None
    shutil.rmtree(job_dir, ignore_errors=True)
    return {
        "rows": n,
        "submitter_s": round(submit_s, 2),
        "submitter_rss_mb": round(submit_rss, 1),
        "ledger_build_s": round(build_s, 1),
        "parts_at_90pct": parts,
        "resume_open_s": round(open_s, 3),
        "resume_open_noindex_s": round(open_noindex_s, 2),
        "resume_first_request_s": round(resume_s, 2),
        "shard_rss_mb": round(shard_rss, 1),
        "parts_at_100pct": parts_done,
        "commit_s": round(commit_s, 1),
        "commit_rss_mb": round(commit_rss, 1),
        "output_rows": out_rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000000,4000000,16000000")
    ap.add_argument("--tmp", default=None, help="where the inputs and ledgers go (default: a temp folder)")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    if min(sizes) * 9 // 10 <= PART_ROWS:  # the 90 % ledger needs an indexed part before its last one
        ap.error(f"--sizes: each size must be above {PART_ROWS * 10 // 9 + 1} rows (90 % of it in two parts or more)")
    res: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=a.tmp) as d, StubEngine(free_port(), latency_ms=0) as stub:
        for n in sizes:
            res.append(one(Path(d), n, stub))
            print(json.dumps(res[-1]), flush=True)
    big, small = res[-1], res[0]
    keys = ("submitter_rss_mb", "resume_open_s", "resume_open_noindex_s", "resume_first_request_s", "shard_rss_mb")
    keys += ("parts_at_100pct",)
    keys += ("commit_s", "commit_rss_mb")
    ratios = {f"{k}_ratio": round(big[k] / small[k], 2) if small[k] else None for k in keys}
    print(json.dumps({"rows_ratio": big["rows"] / small["rows"], **ratios}))


if __name__ == "__main__":
    main()
