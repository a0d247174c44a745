"""Scale of the job engine's bookkeeping at 1M, 4M and 16M rows: commit, resume, memory, part files.

    python bench/scale_data.py [--sizes 1000000,4000000,16000000] [--tmp DIR]
        [--dataset ROWS:SHARDS,...] [--only-dataset] [--repeats 3] [--single-too]

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

Then, per ``--dataset`` case ROWS:SHARDS (default 1M, 4M, 16M rows in 1 shard, and 16M rows in 4, 16,
64 shards: rows vary at a fixed file count, files at fixed rows), an output **folder** (``out/``, the
dataset layout of :mod:`prefect_swarm.jobs.rows.output`):

- every shard's ledger complete and DONE (synthetic, as above: parts of ``--ledger-part-rows``, 1 %
  error rows), then each shard's part files written by :func:`~prefect_swarm.jobs.rows.commit.write_shard_output`
  in its own process (``--write-jobs`` at a time): what a shard's job process does once its last row
  is answered, in parallel with the other shards; reported: their wall time and the largest peak RSS;
- ``commit_output`` (the publish: hard links into a staging folder, manifest, ``_SUCCESS``, one
  rename) in a fresh process pinned to one core, ``--repeats`` times with the published folder and
  the job's manifest removed before each, so each run publishes: the median process wall time
  (``commit_s``, interpreter start and imports included), the median wall and CPU time of the
  ``commit_output`` call itself (``commit_call_s``, ``commit_call_cpu_s``: CPU seconds are what a
  loaded machine distorts least) and peak RSS; the folder is read back with ``pyarrow.dataset``
  (every row once);
- ``--single-too``: the same finished ledgers committed to one ``.parquet`` file (``single_*``).
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
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from _common import CLIENT_CPU, ROOT, dataset, job_argv, median, spec_file

from prefect_swarm.jobs.api import load_job
from prefect_swarm.jobs.checkpoint.fingerprint import fingerprint_details, hash_details
from prefect_swarm.jobs.checkpoint.ledger import ShardLedger
from prefect_swarm.jobs.rows import output
from prefect_swarm.jobs.rows.input import open_input, shard_range
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
    "from prefect_swarm.jobs.checkpoint.plan import pending_shards, job_progress; s = JobSpec.load(sys.argv[1]); "
    "validate_input(s); pending_shards(s); job_progress(s)"
)
COMMIT = HWM + (
    "; import sys, time; from prefect_swarm.jobs.spec import JobSpec; from prefect_swarm.jobs.rows.commit import "
    "commit_output; t, c = time.monotonic(), time.process_time(); commit_output(JobSpec.load(sys.argv[1])); "
    "open(os.environ['BENCH_HWM'] + '.s', 'w').write(f'{time.monotonic() - t} {time.process_time() - c}')"
)
"""The commit in a fresh process; the wall and CPU seconds of the ``commit_output`` call itself (no interpreter
start or imports) to the file ``$BENCH_HWM.s``."""
SHARD = (
    HWM + "; import sys, runpy; sys.argv[0] = 'run'; runpy.run_module('prefect_swarm.jobs.run', run_name='__main__')"
)
WRITE = HWM + (
    "; import sys; from prefect_swarm.jobs.rows import output; "
    "parts = output.PartSizes(int(os.environ['BENCH_PART_BYTES'])); "
    "from prefect_swarm.jobs.spec import JobSpec; from prefect_swarm.jobs.rows.commit import "
    "write_shard_output; write_shard_output(JobSpec.load(sys.argv[1]), int(sys.argv[2]), parts=parts)"
)
"""What a dataset job's shard process does once its last row is answered: its part files, its record (a part
file rolls over past ``$BENCH_PART_BYTES`` of rows: the product's ``output.PART_BYTES``, or less to get more
files from the same rows)."""
PART_MB = output.PART_BYTES // 2**20


def hwm_env(tmp: Path, name: str = "hwm") -> dict[str, str]:
    """The environment of a measured process (see :data:`HWM`)."""
    (tmp / name).unlink(missing_ok=True)
    return {**os.environ, "BENCH_HWM": str(tmp / name)}


def read_hwm(tmp: Path, name: str = "hwm") -> float:
    """The peak RSS (MB) the last measured process wrote."""
    return int((tmp / name).read_text().split()[1]) / 1024


def run_measured(argv: list[str], tmp: Path, cpu: int | None = None) -> tuple[int, float, float]:
    """(exit code, wall seconds, peak RSS MB) of ``argv`` (pinned to ``cpu`` when given)."""
    argv = ["taskset", "-c", str(cpu), *argv] if cpu is not None else argv
    t0 = time.monotonic()
    code = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=hwm_env(tmp))
    if code.returncode:
        print(code.stderr.decode(errors="replace")[-2000:], file=sys.stderr)
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


def open_ledger(spec: JobSpec, n: int, shard: int = 0) -> ShardLedger:
    """Shard ``shard``'s ledger (of ``spec.shards``) on an input of ``n`` rows, opened."""
    ds = open_input(spec)
    details = fingerprint_details(spec, ds)
    job = load_job(spec.job, spec.job_kwargs)
    start, end = shard_range(n, shard, spec.shards)
    led = ShardLedger(
        spec.paths.shard(shard),
        shard=shard,
        nshards=spec.shards,
        start=start,
        end=end,
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


def build_done_shard(spec_path: Path, n: int, i: int, part_rows: int) -> None:
    """Shard ``i``'s ledger complete (parts of ``part_rows`` rows, 1 % errors) and DONE."""
    spec = JobSpec.load(spec_path)
    outputs = list(load_job(spec.job, spec.job_kwargs).outputs)
    led = open_ledger(spec, n, i)
    start, end = shard_range(n, i, spec.shards)
    for lo in range(start, end, part_rows):
        led.append_part(ledger_rows(led.schema, lo, min(end, lo + part_rows), outputs))
    assert led.complete, f"shard {i} ledger incomplete"
    led.flush("done")
    led.mark_done()


def build_done_ledgers(spec_path: Path, n: int, shards: int, part_rows: int, jobs: int) -> float:
    """Every shard's ledger complete and DONE, ``jobs`` shards at a time; seconds taken."""
    t0 = time.monotonic()
    with ProcessPoolExecutor(jobs) as pool:
        list(pool.map(build_done_shard, [spec_path] * shards, [n] * shards, range(shards), [part_rows] * shards))
    return time.monotonic() - t0


def write_shards(spec_path: Path, shards: int, tmp: Path, jobs: int, part_mb: int) -> tuple[float, float]:
    """Each shard's part files written by :func:`write_shard_output` in its own process, ``jobs`` at a
    time (what the shards' job processes do in parallel as each finishes), a part file rolling over
    past ``part_mb`` MiB of rows: (wall seconds of them all, the largest peak RSS MB)."""
    t0 = time.monotonic()
    running: list[tuple[subprocess.Popen[bytes], str]] = []
    rss = 0.0
    for i in [*range(shards), *([None] * jobs)]:
        while running and (len(running) >= jobs or i is None):
            proc, name = running.pop(0)
            assert proc.wait() == 0, f"write_shard_output exit {proc.returncode}"
            rss = max(rss, read_hwm(tmp, name))
        if i is not None:
            name = f"hwm-w{i}"
            argv = [sys.executable, "-c", WRITE, str(spec_path), str(i)]
            env = {**hwm_env(tmp, name), "BENCH_PART_BYTES": str(part_mb * 2**20)}
            running.append((subprocess.Popen(argv, cwd=ROOT, env=env), name))
    return time.monotonic() - t0, rss


def drop_output(spec: JobSpec) -> None:
    """Remove what the shards wrote and the commit published (the ledgers stay done)."""
    out = Path(str(spec.output).rstrip("/"))
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out.parent / f".{out.name}.parts", ignore_errors=True)
    for i in range(spec.shards):
        for record in spec.paths.shard(i).root.glob("output-*"):
            record.unlink()
    spec.paths.manifest.unlink(missing_ok=True)


def publish_runs(spec: JobSpec, spec_path: Path, tmp: Path, repeats: int) -> dict[str, Any]:
    """``commit_output`` of the written dataset ``repeats`` times in a fresh process pinned to one core
    (the published folder and the job's manifest removed before each: every run publishes)."""
    out = Path(str(spec.output).rstrip("/"))
    walls, calls, cpus, rss = [], [], [], []
    manifest: dict[str, Any] = {}
    for _ in range(repeats):
        shutil.rmtree(out, ignore_errors=True)
        spec.paths.manifest.unlink(missing_ok=True)
        code, wall, peak = run_measured([sys.executable, "-c", COMMIT, str(spec_path)], tmp, cpu=CLIENT_CPU)
        assert code == 0, f"commit exit {code}"
        manifest = json.loads(spec.paths.manifest.read_text())
        call, cpu = (float(x) for x in (tmp / "hwm.s").read_text().split())
        walls.append(wall)
        calls.append(call)
        cpus.append(cpu)
        rss.append(peak)
    rows = pads.dataset(out, format="parquet").count_rows()  # what a reader sees: every row once
    assert rows == manifest["rows"], f"dataset holds {rows} rows for {manifest['rows']}"
    return {
        "files": manifest["files"],
        "output_mb": round(manifest["bytes"] / 2**20, 1),
        "failed_rows": manifest["failed"],
        "commit_s": round(median(walls), 3),
        "commit_call_s": round(median(calls), 3),
        "commit_call_cpu_s": round(median(cpus), 3),
        "commit_rss_mb": round(median(rss), 1),
        "commit_runs_s": [round(w, 2) for w in walls],
        "commit_call_runs_s": [round(c, 3) for c in calls],
    }


def dataset_commit(tmp: Path, n: int, shards: int, part_mbs: list[int], a: argparse.Namespace, url: str) -> None:
    """A dataset output (``out/``) of ``n`` rows in ``shards`` shards: ledgers built once; per part-file
    size in ``part_mbs``, each shard's files written, then the publish (:func:`publish_runs`); one JSON
    line each. ``--single-too``: then the same ledgers committed to one file."""
    src = dataset(tmp / f"in-{n}.parquet", n, row_group=100_000)
    job_dir = tmp / f"dsjob-{n}-{shards}"
    shutil.rmtree(job_dir, ignore_errors=True)
    spec_path = spec_file(
        job_dir, src, url, auto_commit=False, shards=shards, output=f"{job_dir / 'out'}/", checkpoint_every=20_000
    )
    spec = JobSpec.load(spec_path)
    build_s = build_done_ledgers(spec_path, n, shards, a.ledger_part_rows, a.write_jobs)
    for mb in part_mbs:
        drop_output(spec)
        write_s, write_rss = write_shards(spec_path, shards, tmp, a.write_jobs, mb)
        res = {"layout": "dataset", "rows": n, "shards": shards, "part_mb": mb, "ledger_build_s": round(build_s, 1)}
        res |= {"shard_write_s": round(write_s, 1), "shard_write_rss_mb": round(write_rss, 1)}
        print(json.dumps(res | publish_runs(spec, spec_path, tmp, a.repeats)), flush=True)
    if a.single_too:
        print(json.dumps({"layout": "file", "rows": n, "shards": shards, **single_commit(tmp, spec_path, a.repeats)}))
    shutil.rmtree(job_dir, ignore_errors=True)


def single_commit(tmp: Path, spec_path: Path, repeats: int) -> dict[str, Any]:
    """The same finished ledgers committed to one ``.parquet`` file instead (the output is not part of the
    fingerprint, so the shards stay done): the streaming merge, ``repeats`` times, pinned to one core."""
    data = json.loads(spec_path.read_text())
    out = Path(data["job_dir"]) / "out.parquet"
    spec_path.write_text(json.dumps({**data, "output": str(out)}))
    spec = JobSpec.load(spec_path)
    walls, calls, cpus, rss = [], [], [], []
    for _ in range(repeats):
        out.unlink(missing_ok=True)
        spec.paths.manifest.unlink(missing_ok=True)
        code, wall, peak = run_measured([sys.executable, "-c", COMMIT, str(spec_path)], tmp, cpu=CLIENT_CPU)
        assert code == 0, f"single-file commit exit {code}"
        call, cpu = (float(x) for x in (tmp / "hwm.s").read_text().split())
        walls.append(wall)
        calls.append(call)
        cpus.append(cpu)
        rss.append(peak)
    meta = pq.read_metadata(out)
    rows, groups = meta.num_rows, meta.num_row_groups
    assert rows == json.loads(spec.paths.manifest.read_text())["rows"], f"single file holds {rows} rows"
    return {
        "single_commit_s": round(median(walls), 2),
        "single_commit_call_s": round(median(calls), 2),
        "single_commit_call_cpu_s": round(median(cpus), 2),
        "single_commit_rss_mb": round(median(rss), 1),
        "single_row_groups": groups,
        "single_runs_s": [round(w, 1) for w in walls],
    }


def single_file(a: argparse.Namespace, tmp: Path, stub: StubEngine) -> None:
    """The single-file figures per size (see the module doc), then the largest ÷ the smallest."""
    res: list[dict[str, Any]] = []
    for n in [int(x) for x in a.sizes.split(",")]:
        res.append(one(tmp, n, stub))
        print(json.dumps(res[-1]), flush=True)
    big, small = res[-1], res[0]
    keys = ("submitter_rss_mb", "resume_open_s", "resume_open_noindex_s", "resume_first_request_s", "shard_rss_mb")
    keys += ("parts_at_100pct",)
    keys += ("commit_s", "commit_rss_mb")
    ratios = {f"{k}_ratio": round(big[k] / small[k], 2) if small[k] else None for k in keys}
    print(json.dumps({"rows_ratio": big["rows"] / small["rows"], **ratios}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000000,4000000,16000000")
    ap.add_argument("--tmp", default=None, help="where the inputs and ledgers go (default: a temp folder)")
    ap.add_argument(
        "--dataset",
        default="1000000:1,4000000:1,16000000:1,16000000:4,16000000:16,16000000:64",
        help="ROWS:SHARDS[:MIB/MIB...],... of the dataset-output commits ('' for none); MIB: part files roll over "
        f"past that many MiB of rows (default {PART_MB}, the product's), each size on the same ledgers",
    )
    ap.add_argument("--only-dataset", action="store_true", help="skip the single-file figures (--sizes)")
    ap.add_argument("--repeats", type=int, default=3, help="commits per dataset case (the median is printed)")
    ap.add_argument("--ledger-part-rows", type=int, default=1_000_000, help="rows per part of a dataset case's ledgers")
    ap.add_argument("--write-jobs", type=int, default=2, help="shards built / writing their files at once")
    ap.add_argument("--single-too", action="store_true", help="also commit each dataset case's ledgers to one file")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    if not a.only_dataset and min(sizes) * 9 // 10 <= PART_ROWS:  # the 90 % ledger needs two parts or more
        ap.error(f"--sizes: each size must be above {PART_ROWS * 10 // 9 + 1} rows (90 % of it in two parts or more)")
    cases = [[int(v) for v in c.replace("/", ":").split(":")] for c in a.dataset.split(",") if c]
    with tempfile.TemporaryDirectory(dir=a.tmp) as d, StubEngine(free_port(), latency_ms=0) as stub:
        if not a.only_dataset:
            single_file(a, Path(d), stub)
        for n, shards, *part_mbs in cases:
            dataset_commit(Path(d), n, shards, part_mbs or [PART_MB], a, stub.url)


if __name__ == "__main__":
    main()
