"""Shared helpers of the benchmarks: datasets, stub engine, pinned job processes, medians."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
SERVER_CPU, CLIENT_CPU = 0, 1


def dataset(path: Path, n: int, chunk: int = 1_000_000, row_group: int = 50_000) -> Path:
    """``n`` rows of (id ``r00000012``, prompt ``question 00000012 about a topic``), built with arrow
    kernels in chunks (16M rows in seconds, memory bounded by ``chunk``)."""
    import numpy as np
    import pyarrow.compute as pc

    if path.exists() and pq.read_metadata(path).num_rows == n:
        return path
    schema = pa.schema([("id", pa.string()), ("prompt", pa.string())])
    with pq.ParquetWriter(path, schema) as w:
        for lo in range(0, n, chunk):
            num = pc.utf8_lpad(pa.array(np.arange(lo, min(n, lo + chunk))).cast(pa.string()), 8, "0")
            ids = pc.binary_join_element_wise("r", num, "")
            prompts = pc.binary_join_element_wise("question ", num, " about a topic", "")
            w.write_table(pa.table({"id": ids, "prompt": prompts}, schema=schema), row_group_size=row_group)
    return path


def spec_file(job_dir: Path, src: Path, url: str, **fields: Any) -> Path:
    """A JobSpec file for a benchmark job."""
    job_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "input": str(src),
        "output": str(job_dir / "out.parquet"),
        "job_dir": str(job_dir),
        "id_column": "id",
        "endpoints": [url],
        "model": "stub-model",
        "concurrency": 256,
        "checkpoint_every": 5000,
        "job_kwargs": {"sampling": {"max_tokens": 8}},
        **fields,
    }
    path = job_dir / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def run_pinned(argv: list[str], cpu: int = CLIENT_CPU) -> tuple[int, float, int]:
    """Run ``argv`` pinned to ``cpu``; return (exit code, wall seconds, peak RSS in bytes) of that process."""
    t0 = time.monotonic()
    proc = subprocess.Popen(["taskset", "-c", str(cpu), *argv], cwd=ROOT, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.monotonic() - t0, usage.ru_maxrss * 1024


def job_argv(spec: Path) -> list[str]:
    """The job process for shard 0 of 1."""
    return [
        sys.executable,
        "-m",
        "prefect_swarm.jobs.run",
        "--spec",
        str(spec),
        "--shard-id",
        "0",
        "--nshards",
        "1",
    ]


def median(xs: list[float]) -> float:
    """Median."""
    return float(statistics.median(xs))


@contextlib.contextmanager
def job_beside(
    cli: Callable[..., subprocess.CompletedProcess[str]],
    name: str,
    config: dict[str, Any],
    rows: int,
    tmp: Path,
    env: dict[str, str],
) -> Iterator[None]:
    """A second job running beside what the block measures: swarm ``config`` (named ``name``) brought up
    with ``cli`` (the bench's ``prefect-swarm`` runner, pinned as it pins), then ``job submit`` of ``rows``
    rows with defaults on the client core, waited until its replica has seen a request; cancelled and
    the swarm brought down at the end, whatever happened."""
    import httpx
    import yaml

    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(config))
    res = cli("up", "-c", str(cfg), env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    side: subprocess.Popen[str] | None = None
    try:
        big = dataset(tmp / f"beside-{rows}.parquet", rows)
        argv = ["taskset", "-c", str(CLIENT_CPU), str(Path(sys.executable).with_name("prefect-swarm"))]
        argv += ["job", "submit", "-n", name, "--input", str(big), "--output", str(tmp / f"{name}-out.parquet")]
        side = subprocess.Popen([*argv, "--id", name], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{config['port']}"
        deadline = time.monotonic() + 60
        while httpx.get(url + "/stats", timeout=5).json().get("requests", 0) == 0:
            if time.monotonic() > deadline or side.poll() is not None:
                raise RuntimeError(f"the job beside sent nothing in 60 s (exit {side.poll()})")
            time.sleep(0.1)
        yield
    finally:
        if side is not None:
            cli("job", "cancel", name, env=env)  # its processes, not only the command waiting on them
            side.terminate()
            side.wait()
        cli("down", name, "--yes", "--force", env=env)


def wait_healthy(urls: list[str], timeout_s: float = 60.0) -> None:
    """Every URL answers ``/health`` (a loaded machine starts processes slowly)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    for url in urls:
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not start")
            time.sleep(0.1)
