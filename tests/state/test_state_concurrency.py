"""Twenty processes create, update and delete records at once; nothing is lost, nothing is locked."""

from __future__ import annotations

import multiprocessing as mp
import traceback
from pathlib import Path

import pytest

from prefect_swarm.state import JobRecord, StateStore, SwarmRecord

NPROC = 20
PER_PROC = 15


def _worker(db: str, i: int, ready: mp.Queue, start: mp.synchronize.Event, errors: mp.Queue) -> None:  # type: ignore[name-defined]
    try:
        store = StateStore(db, busy_timeout_ms=60_000)  # lazy: touches nothing yet
        ready.put(i)
        start.wait(120)  # all twenty start together, and all open (and migrate) a fresh file at once
        for k in range(PER_PROC):
            name = f"s{i}-{k}"
            store.put_swarm(SwarmRecord(name=name, backend="local", config={"i": i, "k": k}, phase="PENDING"))
            store.update_swarm(name, phase="RUNNING", handle={"name": name, "backend": "local"})
            store.put_job(JobRecord(id=f"j{i}-{k}", swarm=name, spec={"k": k}, status="PENDING"))
            store.update_job(f"j{i}-{k}", status="SUCCEEDED", progress={"done": k})
            store.list_swarms()  # readers run alongside writers
            if k % 3 == 0:
                assert store.delete_swarm(name)
                assert store.delete_job(f"j{i}-{k}")
    except BaseException:
        errors.put(f"process {i}: {traceback.format_exc()}")


@pytest.mark.slow
def test_twenty_processes_lose_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "state.db")
    ctx = mp.get_context("spawn")
    ready, start, errors = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(db, i, ready, start, errors)) for i in range(NPROC)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    start.set()
    for p in procs:
        p.join(240)
    problems = []
    while not errors.empty():
        problems.append(errors.get())
    assert problems == [], "\n".join(problems)
    assert all(p.exitcode == 0 for p in procs)

    store = StateStore(db)
    kept = {(i, k) for i in range(NPROC) for k in range(PER_PROC) if k % 3 != 0}
    swarms = {r.name: r for r in store.list_swarms()}
    assert set(swarms) == {f"s{i}-{k}" for i, k in kept}
    assert {r.phase for r in swarms.values()} == {"RUNNING"}
    assert all(r.handle == {"name": n, "backend": "local"} for n, r in swarms.items())
    jobs = {j.id: j for j in store.list_jobs()}
    assert set(jobs) == {f"j{i}-{k}" for i, k in kept}
    assert all(j.status == "SUCCEEDED" and j.progress == {"done": int(j.id.split("-")[1])} for j in jobs.values())
    assert store.journal_mode == "wal"
