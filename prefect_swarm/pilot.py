"""A pilot run: the first K rows of a job's input through a running swarm, to project the whole input.

``prefect-swarm validate -c SWARM.yaml --estimate K --input IN [job options]`` runs one
(:func:`prefect_swarm.launch.pilot_job` puts these pieces together):

- the first K rows of the input are copied into a throwaway folder (parquet: read row group by row
  group up to K rows; OpenAI Batch JSONL: the first K lines), with a spec aimed at the swarm as a job
  would be (:func:`~prefect_swarm.launch.for_swarm`: its endpoints, replica capacity, shard count for
  K rows), ``auto_commit`` off and the output inside the throwaway folder;
- that many job processes (``python -m prefect_swarm.jobs.run``, the job's own code path) run on
  this machine against the swarm's endpoints and exit; exactly one request per row is sent (retries
  aside), nothing is recorded in the state database and the job's real output and ledger are not
  touched; the folder is removed afterwards;
- the shards checkpoint every :func:`pilot_checkpoint` rows (a fortieth of the pilot), and this
  process reads their progress files while they run: a time line of rows answered.

A job's wall time is a fixed part (the processes' start, the first answers' latency, the tail: the
last rows in flight, the longest answers among them, drain after the last row is sent) plus its rows
at the steady rate. The pilot has both, once each, as the whole job will: the **steady rate** is, by
Little's law, the requests its shards hold in flight between 20 % and 80 % of its rows over its
answers' mean latency (read from its ledger; the slope of its time line where those are missing),
the **start and tail** is its wall time (processes started → last row answered) less its rows at
that rate. The projection is ``start and tail + rows / steady rate``
(the rate scaled to the target's replicas; the start and tail kept). The tail's longest answers are
those the pilot met: a pilot that keeps the swarm full for a while (:data:`STEADY_FACTOR`) has seen
as many answers in flight at once as the job will, so its tail is the job's.

The whole input's row count comes from cheap metadata (:func:`~prefect_swarm.jobs.rows.input.open_input`:
what is kept with the job when it has a job folder, else parquet footers; a JSONL file is counted line
by line, as every job does at submit). :func:`~prefect_swarm.config.cost.projection` turns the rate into
wall time, GPU-hours and USD, for the swarm as it runs or for another replica count (linear scaling).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefect_swarm.config import SwarmConfig
from prefect_swarm.config.cost import projection
from prefect_swarm.config.errors import invalid_fields
from prefect_swarm.exceptions import ConfigError, JobError
from prefect_swarm.interfaces.jobenv import LOG_LEVEL
from prefect_swarm.jobs.rows.input import InputDataset, open_input
from prefect_swarm.jobs.spec import JobSpec, is_jsonl
from prefect_swarm.paths import read_json
from prefect_swarm.sizing import swarm_inflight

MIDDLE = (0.2, 0.8)
"""The share of the pilot's rows over which its steady rate is measured."""
BURST = 0.02
"""Progress writes closer than this share of the pilot's span are one burst of answers."""
STEADY_FACTOR = 3
"""A pilot of at least this many times the swarm's in-flight target keeps every replica full for most
of its run; a smaller one measures mostly the ramp (its rate is a lower bound)."""


def pilot_size(cfg: SwarmConfig) -> int:
    """The fewest pilot rows that measure swarm ``cfg``'s steady rate: :data:`STEADY_FACTOR` x what keeps
    it full. Said before a pilot runs; after it, :func:`estimate` adds what its longest answer needs."""
    return STEADY_FACTOR * swarm_inflight(cfg)


def pilot_size_text(cfg: SwarmConfig, rows: int) -> str:
    """The line said before a pilot of ``rows`` rows runs on swarm ``cfg``: the pilot it needs, up front."""
    needed = pilot_size(cfg)
    text = (
        f"pilot of {rows} rows on '{cfg.name}': a projection within 10 % needs at least {needed} "
        f"({STEADY_FACTOR}x the {swarm_inflight(cfg)} requests that keep its {cfg.replicas} replica(s) full), "
        f"and {STEADY_FACTOR}x its longest answer at its rate (a long tail of answer lengths needs more: "
        "said after the pilot)"
    )
    if rows < needed:
        text += f"; {rows} rows will measure mostly the ramp: --estimate {needed} or more"
    return text


PILOT_TIMEOUT_S = 3600.0
"""Most seconds a pilot may run before it is stopped."""
POLL_S = 0.1
"""How often the pilot's progress files are read while it runs."""


def pilot_input(ds: InputDataset, k: int, folder: Path) -> Path:
    """The first ``k`` rows of ``ds`` as a file of the same kind in ``folder``."""
    if ds.kind == "jsonl":
        path = folder / "pilot-input.jsonl"
        with path.open("w") as fh:
            for _, batch in ds.iter_range(0, k, None, k):
                for rec in batch.to_pylist():
                    line = {key: v for key, v in rec.items() if v is not None}
                    line["body"] = json.loads(rec["body"])
                    fh.write(json.dumps(line) + "\n")
        return path
    path = folder / "pilot-input.parquet"
    batches = [b for _, b in ds.iter_range(0, k, None, min(k, 65536))]
    pq.write_table(pa.Table.from_batches(batches, schema=ds.schema), path)
    return path


def pilot_spec(spec: JobSpec, k: int, folder: Path) -> tuple[JobSpec, int]:
    """``spec`` on the first ``k`` rows, in ``folder`` (its own job dir and output, no auto commit);
    returns it with the whole input's row count. The caller aims it at the swarm and saves it."""
    ds = open_input(spec)  # the metadata kept with the job when it has one; else the footers only
    k = min(k, ds.num_rows)
    data = pilot_input(ds, k, folder)
    out = folder / ("pilot-output.jsonl" if is_jsonl(str(data)) else "pilot-output.parquet")
    fields = spec.model_dump(exclude_unset=True, exclude={"job_id", "job_dir", "output_format", "shards", "ledger"})
    fields.update(input=str(data), output=str(out), job_dir=str(folder / "job"), job_id="pilot", auto_commit=False)
    fields.update(checkpoint_every=pilot_checkpoint(k))
    try:
        pilot = JobSpec.model_validate(fields)
    except ValueError as exc:
        raise invalid_fields(exc, JobSpec, "invalid job arguments for the pilot") from exc
    return pilot, ds.num_rows


def pilot_checkpoint(k: int) -> int:
    """Rows between two checkpoints of a pilot of ``k`` rows: about 40 points on its time line."""
    return max(10, k // 40)


Timeline = list[tuple[float, int, int | None]]
"""(time, rows answered, requests in flight) of every shard together at each progress write of a
pilot's shards (in flight None where a shard does not tell it)."""
Write = tuple[float, int, int | None]
"""One progress write of a shard: ``(updated_at, done, in_flight)``."""


def timeline(writes: dict[int, list[Write]]) -> Timeline:
    """The pilot's rows answered (and requests in flight) over time from each shard's progress writes."""
    done: dict[int, int] = {}
    flying: dict[int, int | None] = {}
    out: Timeline = []
    for t, shard, d, f in sorted((w[0], i, w[1], w[2]) for i, seen in writes.items() for w in seen):
        done[shard], flying[shard] = d, f
        known = [x for x in flying.values() if x is not None]
        out.append((t, sum(done.values()), sum(known) if len(known) == len(flying) else None))
    return out


def steady_rate(line: Timeline, rows: int, latencies_s: list[float] | None = None) -> float | None:
    """Rows/s once the pilot is steady, over its writes at :data:`MIDDLE` of ``rows`` (None: too few).

    With its answers' latencies: Little's law, the requests in flight there (their median) over the
    mean latency, which holds whatever the answers' lengths and whenever checkpoints are written.
    Without: the slope of the rows answered. Answers come in bursts where a batch's answers end
    together, and a burst can write several checkpoints at once: only the last write of a burst
    (writes closer than :data:`BURST` of the pilot's span) counts, so the slope is measured from the
    end of one burst to the end of another, whole bursts between them."""
    if len(line) < 2:
        return None
    # in flight where rows were still left to send: the window was held full (a pilot smaller than
    # its window sends everything at once and only drains: no steady state to apply the law to)
    middle = [f for _, d, f in line if MIDDLE[0] * rows <= d <= MIDDLE[1] * rows and d + (f or 0) < rows]
    if latencies_s and middle and all(f is not None for f in middle):
        flying = sorted(f for f in middle if f is not None)[len(middle) // 2]
        mean = sum(latencies_s) / len(latencies_s)
        if flying > 0 and mean > 0:
            return flying / mean
    gap = BURST * (line[-1][0] - line[0][0])
    ends = [p for p, q in itertools.pairwise(line) if q[0] - p[0] > gap] + [line[-1]]
    lo = next(((t, d) for t, d, _ in ends if d >= MIDDLE[0] * rows), None)
    hi = next(((t, d) for t, d, _ in ends if d >= MIDDLE[1] * rows), None)
    if lo is None or hi is None or hi[0] - lo[0] <= 0 or hi[1] <= lo[1]:
        return None
    return (hi[1] - lo[1]) / (hi[0] - lo[0])


def estimate(
    progress: dict[str, Any],
    total: int,
    ran_on: SwarmConfig,
    target: SwarmConfig,
    processes: int,
    line: Timeline | None = None,
    launched_at: float | None = None,
    latencies_s: list[float] | None = None,
) -> dict[str, Any]:
    """The pilot's figures and the whole input's projection (see the module doc: the steady rate
    scaled by ``target``'s replicas over ``ran_on``'s, plus the pilot's start and tail). ``line``:
    the pilot's :func:`timeline`; ``launched_at``: when its processes were started (else the first
    shard's start); ``latencies_s``: its answers' latencies (:func:`latencies`). The pilot it needs
    (``pilot_rows_needed``, a note when it ran fewer rows) lasts :data:`STEADY_FACTOR` times what keeps
    the swarm full and its longest answer at its steady rate: a long tail of answer lengths needs more."""
    shards = progress["shards"]
    started = min(float(s["started_at"]) for s in shards)
    ended = max(float(s["updated_at"]) for s in shards)
    seconds = max(ended - started, 1e-6)
    rows, failed = int(progress["done"]), int(progress["failed"])
    rate = rows / seconds
    steady = steady_rate(line or [], rows, latencies_s) or rate
    fixed = max(0.0, ended - min(launched_at or started, started) - rows / steady)
    scale = target.replicas / max(ran_on.replicas, 1)
    inflight = swarm_inflight(ran_on)
    longest = max(latencies_s) if latencies_s else 0.0
    needed = math.ceil(max(pilot_size(ran_on), STEADY_FACTOR * steady * longest))
    notes = []
    if rows < needed:
        notes.append(
            f"the pilot ({rows} rows) is under {needed} rows: {STEADY_FACTOR}x what keeps the swarm full "
            f"({inflight} in flight) and {STEADY_FACTOR}x its longest answer ({longest:.1f}s) at its steady rate; "
            "it measured mostly the ramp and the tail, so its rate is not the steady one; "
            f"--estimate {needed} or more measures it"
        )
    if scale != 1:
        notes.append(
            f"measured on {ran_on.replicas} replica(s), projected for {target.replicas}: assumes rows/s grows "
            "with the replicas (bench/scale.py measures how close a swarm comes)"
        )
    if failed:
        notes.append(f"{failed} of {rows} pilot rows failed: look at the job before running it on the whole input")
    tokens = int(progress["prompt_tokens"]) + int(progress["completion_tokens"])
    return {
        "pilot_rows": rows,
        "pilot_failed": failed,
        "pilot_requests": sum(int(s.get("requests") or 0) for s in shards),
        "pilot_seconds": round(seconds, 3),
        "pilot_rate_rows_s": round(rate, 2),
        "steady_rate_rows_s": round(steady, 2),
        "start_and_tail_s": round(fixed, 2),
        "rows_s_per_replica": round(steady / max(ran_on.replicas, 1), 2),
        "pilot_processes": processes,
        "tokens_per_row": round(tokens / rows, 1) if rows else None,
        "measured_replicas": ran_on.replicas,
        "projected_replicas": target.replicas,
        "inflight_target": inflight,
        "pilot_rows_needed": needed,
        "longest_answer_s": round(longest, 2),
        "notes": notes,
        "projection": projection(
            done=0,
            total=total,
            rate_rows_s=steady * scale,
            elapsed_s=fixed,
            gpus=target.replicas * max(target.gpus_per_replica, 0),
            cost=target.backend.cost,
            min_elapsed_s=0.0,
        ),
    }


def run_processes(
    pilot: JobSpec, module: str, secret_env: dict[str, str], timeout_s: float = PILOT_TIMEOUT_S
) -> tuple[float, Timeline]:
    """Run every shard of ``pilot`` as a job process (``python -m module``) on this machine
    (``secret_env``: the swarm's API key, :meth:`JobEnv.secret_env`), reading their progress files
    while they run; return when they were started and the pilot's :func:`timeline`. ConfigError
    (bad input) or JobError with a log tail when one fails."""
    env = {**os.environ, **secret_env, LOG_LEVEL: "WARNING"}
    launched_at = time.time()
    logs = [pilot.paths.root / f"pilot-{i}.log" for i in range(pilot.shards)]
    procs = []
    for i, log in enumerate(logs):
        argv = [sys.executable, "-m", module, "--spec", str(pilot.paths.spec)]
        argv += ["--shard-id", str(i), "--nshards", str(pilot.shards)]
        with log.open("w") as fh:
            procs.append(subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT))
    writes: dict[int, list[Write]] = {i: [] for i in range(pilot.shards)}
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise JobError(f"the pilot ran past {timeout_s:g}s; it was stopped. Try a smaller --estimate.")
            _read_writes(pilot, writes)
            with contextlib.suppress(subprocess.TimeoutExpired):
                next(p for p in procs if p.poll() is None).wait(timeout=POLL_S)
        codes = [p.wait() for p in procs]
        _read_writes(pilot, writes)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
    bad = [(i, c) for i, c in enumerate(codes) if c != 0]
    if bad:
        i, code = bad[0]
        tail = logs[i].read_text(errors="replace")[-2000:]
        err = ConfigError if code == 2 else JobError
        raise err(f"the pilot's job process {i} exited {code}; nothing was projected. Its log ends:\n{tail}")
    return launched_at, timeline(writes)


def latencies(pilot: JobSpec) -> list[float]:
    """Seconds each answered row of ``pilot`` took (its shards' ledgers)."""
    from prefect_swarm.jobs.checkpoint.ledger import read_ledger

    out: list[float] = []
    for i in range(pilot.shards):
        table = read_ledger(pilot.paths.shard(i), columns=["status", "latency_ms"])
        if table is not None:
            cols = table.to_pydict()
            out += [ms / 1000 for st, ms in zip(cols["status"], cols["latency_ms"], strict=True) if st == "ok" and ms]
    return out


def _read_writes(pilot: JobSpec, writes: dict[int, list[Write]]) -> None:
    """Add each shard's latest progress write to ``writes`` when it is new."""
    for i, seen in writes.items():
        doc = read_json(pilot.paths.shard(i).progress)
        if isinstance(doc, dict) and doc.get("updated_at") and (not seen or seen[-1][0] != doc["updated_at"]):
            flying = doc.get("in_flight")
            seen.append((float(doc["updated_at"]), int(doc.get("done") or 0), None if flying is None else int(flying)))
