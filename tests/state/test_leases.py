"""Leases: who holds a swarm. One bring-up for concurrent claimers; the last live holder stops it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prefect_swarm.holding import dead_owners
from prefect_swarm.interfaces import JobStatus, ServingPhase
from prefect_swarm.state import (
    SCHEMA_VERSION,
    Claim,
    JobRecord,
    LeaseKind,
    StateStore,
    SwarmRecord,
    flow_run_lease,
    job_lease,
    keep_lease,
    process_lease,
)
from prefect_swarm.swarm import LIVE_PHASES
from prefect_swarm.testing.waiting import wait_until


def _rec(name: str = "s", phase: ServingPhase = ServingPhase.PENDING) -> SwarmRecord:
    return SwarmRecord(name=name, backend="local", config={}, phase=phase, fingerprint="f")


def test_schema_has_leases(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    assert store.schema_version == SCHEMA_VERSION >= 4
    assert store.list_leases() == []


def test_concurrent_claims_bring_up_once(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    results: list[Claim] = []
    lock = threading.Lock()

    def claim(i: int) -> None:
        got, _ = StateStore(store.path).claim_swarm(_rec(), flow_run_lease(f"run-{i}"), LIVE_PHASES)
        with lock:
            results.append(got)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results).count(Claim.BRING_UP) == 1 and results.count(Claim.ATTACH) == 7
    assert {x.owner for x in store.list_leases("s")} == {f"flow-run:run-{i}" for i in range(8)}


def test_release_stops_only_after_the_last_holder(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    store.claim_swarm(_rec(), flow_run_lease("a"), LIVE_PHASES)
    store.claim_swarm(_rec(), flow_run_lease("b"), LIVE_PHASES)
    teardown = process_lease(LeaseKind.TEARDOWN)
    left = store.release_and_claim_teardown("s", "flow-run:a", set(), teardown)
    assert [x.owner for x in left] == ["flow-run:b"]
    assert store.release_and_claim_teardown("s", "flow-run:b", set(), teardown) == []
    # while it is being stopped, a newcomer waits instead of attaching to a dying swarm
    assert store.claim_swarm(_rec(), flow_run_lease("c"), LIVE_PHASES) == (Claim.WAIT, None)
    assert store.clear_leases("s") == 1
    store.update_swarm("s", phase=ServingPhase.STOPPED)
    got, rec = store.claim_swarm(_rec(), flow_run_lease("c"), LIVE_PHASES)
    assert got is Claim.BRING_UP and rec is not None and rec.phase is ServingPhase.PENDING


def test_dead_owners(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead_pid = process_lease()
    dead_pid = type(dead_pid)(**{**dead_pid.__dict__, "swarm": "s", "owner": "pid:x", "pid": gone.pid})
    alive_pid = process_lease()
    store.put_job(JobRecord(id="j1", spec={}, status=JobStatus.RUNNING))
    store.put_job(JobRecord(id="j2", spec={}, status=JobStatus.SUCCEEDED))
    leases = [
        dead_pid,
        alive_pid,
        job_lease("s", "j1"),
        job_lease("s", "j2"),
        keep_lease("s"),
        flow_run_lease("ended"),
        flow_run_lease("running"),
    ]
    time.sleep(0.01)
    dead = dead_owners(leases, store, lambda ids: {i: i == "ended" for i in ids})
    assert dead == {"pid:x", "job:j2", "flow-run:ended"}
    # Prefect cannot be asked: a flow run's lease is judged by its process (alive here: this one)
    assert "flow-run:ended" not in dead_owners(leases, store, None)


def test_a_flow_run_nobody_can_ask_about_is_judged_by_its_process(tmp_path: Path) -> None:
    """A flow run on a server that is gone (Prefect's temporary one) or that the API does not know:
    its lease is dead once its process is gone on this host; Prefect's word, where it has one, wins."""
    store = StateStore(tmp_path / "state.db")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = dataclasses.replace(flow_run_lease("temp-server-run"), swarm="s", pid=gone.pid)
    running = dataclasses.replace(flow_run_lease("still-running"), swarm="s", pid=gone.pid)
    alive = dataclasses.replace(flow_run_lease("alive"), swarm="s")
    leases = [orphan, running, alive]
    assert dead_owners(leases, store, None) == {"flow-run:temp-server-run", "flow-run:still-running"}
    # the API knows one of them and says it still runs (its process may be elsewhere): live
    said = dead_owners(leases, store, lambda ids: {"still-running": False})
    assert said == {"flow-run:temp-server-run"}
    # another host's process cannot be looked at: live until Prefect says otherwise
    remote = dataclasses.replace(orphan, host="elsewhere")
    assert dead_owners([remote], store, None) == set()


def test_detached_job_lease_ends_with_its_processes_without_a_status_call(
    run_cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """`job submit --detach` leaves a job lease and a RUNNING row; once the job's processes have
    ended, `down` (no --force) stops the swarm although nobody asked `job status` since."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    from prefect_swarm.launch import running_submissions
    from prefect_swarm.testing.stub_engine import stub_swarm_config

    cfg, hold = tmp_path / "swarm.yaml", tmp_path / "hold"
    cfg.write_text(yaml.safe_dump(stub_swarm_config("leased", latency_ms=50, hold_while=str(hold))))
    n = 30
    pq.write_table(
        pa.table({"id": [f"r{i}" for i in range(n)], "prompt": [f"hi {i}" for i in range(n)]}), tmp_path / "in.parquet"
    )
    assert run_cli("up", "-c", str(cfg), timeout=120).returncode == 0
    hold.touch()  # the engine answers nothing while it exists: the job runs until the test lets it end
    sub = run_cli(
        "job", "submit", "-n", "leased", "--input", str(tmp_path / "in.parquet"), "--output",
        str(tmp_path / "out.parquet"), "--id-column", "id", "--id", "jd", "--concurrency", "2", "--detach",
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    store = StateStore()
    assert {x.owner for x in store.list_leases("leased")} == {"keep", "job:jd"}
    refused = run_cli("down", "leased", "-y")  # the job's requests are held: it is still running
    assert refused.returncode != 0 and "job:jd" in refused.stderr, refused.stdout + refused.stderr
    hold.unlink()
    wait_until(  # the backend's probe; the row is not updated
        "the job to finish",
        lambda: running_submissions("jd", store=store),
        until=lambda running: not running,
        timeout_s=60,
    )
    assert store.require_job("jd").status is JobStatus.RUNNING  # nobody refreshed it
    down = run_cli("down", "leased", "-y")
    assert down.returncode == 0, down.stdout + down.stderr
    assert store.require_swarm("leased").phase is ServingPhase.STOPPED
    assert store.list_leases("leased") == []
