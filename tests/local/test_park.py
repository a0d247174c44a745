"""Park and restore a local swarm (issue 42, items 1 and 2): real watchdogs and stub engines.

Parking stops every engine and keeps the snapshot (0600, no secret) in the swarm's folder; the
swarm shows PARKED; a restore takes the same ports again; a job that spans a park and a restore
pauses (past its ``outage_timeout_s``) and finishes every row exactly once, none failed; a parked
kept swarm is woken by the holders that need it, with one restore however many arrive at once.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from local_kit import stub_config

from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError, StateError
from prefect_swarm.holding import Held, Holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.interfaces.parking import Snapshot
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.launch import job_status, submit_job, wait_job
from prefect_swarm.sidecar.procref import ProcRef
from prefect_swarm.state import StateStore, keep_lease, process_lease
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.waiting import wait_until

KEY = "sk-park-test-0123456789abcdef"


def _kept(hold: Holding, cfg: SwarmConfig) -> Swarm:
    """``up`` of ``cfg`` as the CLI does it: held by the KEEP lease, waited until ready."""
    return hold.bring_up(Swarm(cfg, store=hold.store, keep=True), keep_lease(cfg.name), wait=True).swarm


def _engines(swarm: Swarm) -> list[ProcRef | None]:
    return [ProcRef.from_dict(w) for w in (swarm.handle.meta.get("watchdogs") if swarm.handle else [])]


def _answers(url: str) -> bool:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    except httpx.TransportError:
        return False
    return r.status_code == 200


def test_park_stops_the_engines_keeps_a_private_snapshot_and_restore_takes_the_ports_again() -> None:
    hold = Holding(StateStore())
    cfg = stub_config(2, api_key=KEY)
    swarm = _kept(hold, cfg)
    try:
        urls = swarm.handle.meta["replica_urls"] if swarm.handle else []
        dogs = _engines(swarm)
        assert all(_answers(u) for u in urls)

        snap = hold.park(cfg.name, "by the test")
        rec = hold.store.require_swarm(cfg.name)
        assert rec.phase is ServingPhase.PARKED and rec.keep
        assert not any(d is not None and d.alive() for d in dogs), "a watchdog outlived the park"
        assert not any(_answers(u) for u in urls)
        assert Swarm.from_state(cfg.name, hold.store).status().phase is ServingPhase.PARKED
        # the snapshot: this user's alone, no secret, what a restore needs
        path = swarm.paths.parked
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.geteuid()
        assert KEY not in path.read_text()
        assert snap.key_file == str(swarm.paths.api_key_file) and snap.config_file == str(swarm.paths.config)
        assert snap.serving["ports"] == [cfg.port, cfg.port + 1]
        assert Snapshot.read(swarm.paths) == snap
        assert hold.park(cfg.name, "again") == snap  # idempotent
        assert [x.owner for x in hold.holders(cfg.name)] == ["keep"]  # its holders keep their holds

        got = hold.restore(cfg.name)
        assert got.ready is not None and got.ready.phase is ServingPhase.RUNNING
        rec = hold.store.require_swarm(cfg.name)
        assert rec.phase is ServingPhase.RUNNING and rec.keep
        assert (rec.handle or {})["meta"]["replica_urls"] == urls  # the same ports again
        assert all(_answers(u) for u in urls)
        assert not path.exists()
        assert [x.owner for x in hold.holders(cfg.name)] == ["keep"]  # the restore's own hold is gone
    finally:
        Swarm.from_state(cfg.name, hold.store).down()
    assert not swarm.paths.parked.exists()


def test_park_refuses_what_is_not_live_and_down_ends_a_parked_swarm() -> None:
    hold = Holding(StateStore())
    cfg = stub_config(1)
    _kept(hold, cfg)
    hold.park(cfg.name, "by the test")
    hold.release_keep(cfg.name)  # `down`: the last holder lets go
    rec = hold.store.require_swarm(cfg.name)
    assert rec.phase is ServingPhase.STOPPED
    assert not Swarm.from_state(cfg.name, hold.store).paths.parked.exists()
    with pytest.raises(StateError, match=rf"swarm '{cfg.name}' is STOPPED, so there is nothing to park"):
        hold.park(cfg.name, "again")
    with pytest.raises(StateError, match="not parked: nothing to restore"):
        hold.restore(cfg.name)


def test_external_backend_refuses_to_park_with_its_reason() -> None:
    from prefect_swarm.backends.external.serving import ExternalServing
    from prefect_swarm.interfaces import ServingHandle
    from prefect_swarm.paths import SwarmPaths

    cfg = SwarmConfig.model_validate(
        {"name": "ext-park", "model": "m", "backend": {"type": "external", "url": "http://127.0.0.1:9"}}
    )
    serving = ExternalServing(cfg, SwarmPaths.of(cfg.name, None))
    with pytest.raises(ConfigError, match="park, which the external backend lacks: the endpoint's GPUs are not"):
        serving.park(ServingHandle(name=cfg.name, backend="external"))


def test_a_job_spanning_a_park_and_a_restore_pauses_and_finishes_exactly_once(tmp_path: Path) -> None:
    """The job's outage_timeout_s is 1 s and the swarm stays parked for longer: the shards wait (a
    parked swarm is a pause, not an outage), then every row is answered once, none failed."""
    hold = Holding(StateStore())
    cfg = stub_config(2, api_key=KEY)
    _kept(hold, cfg)
    n = 3000
    ids = [f"r{i:06d}" for i in range(n)]
    pq.write_table(pa.table({"id": ids, "prompt": [f"question {i}" for i in range(n)]}), tmp_path / "in.parquet")
    spec = JobSpec(
        input=str(tmp_path / "in.parquet"),
        output=str(tmp_path / "out.parquet"),
        id_column="id",
        shards=2,
        concurrency=4,
        checkpoint_seconds=0.2,
        outage_timeout_s=1.0,
        max_retries=1,
    )
    try:
        swarm = Swarm.from_state(cfg.name, hold.store)
        rec = submit_job(swarm, spec, detach=True)
        wait_until("rows answered", lambda: job_status(rec.id)["progress"].get("done") or 0, timeout_s=60)
        hold.park(cfg.name, "by the test")
        parked_at = time.monotonic()
        done = job_status(rec.id)["progress"].get("done") or 0
        assert done < n, "the job finished before the park: nothing spanned it"
        time.sleep(3.0)  # three outage_timeout_s: an outage would have stopped the shards by now
        doc = job_status(rec.id)
        assert doc["status"] == "RUNNING", doc
        assert all(b["status"] == "RUNNING" for b in doc["backend"]), doc["backend"]
        assert time.monotonic() - parked_at > 2 * spec.outage_timeout_s
        hold.restore(cfg.name)
        final = wait_job(rec.id, timeout_s=120)
    finally:
        Swarm.from_state(cfg.name, hold.store).down()
    assert final["status"] == "SUCCEEDED", final
    rows = pq.read_table(tmp_path / "out.parquet", columns=["id", "status"]).to_pylist()
    assert [r["id"] for r in rows] == ids  # exactly once, in order
    assert [r for r in rows if r["status"] != "ok"] == []
    assert (final["manifest"]["ok"], final["manifest"]["failed"]) == (n, 0)


def test_three_holders_at_once_wake_a_parked_kept_swarm_with_one_restore(caplog: pytest.LogCaptureFixture) -> None:
    """What a run that needs a parked swarm does (``Holding.bring_up``, as ``hold_swarm``/``swarm_up``):
    three at once, one restore; the swarm stays kept and each holder holds it."""
    hold = Holding(StateStore())
    cfg = stub_config(2)
    _kept(hold, cfg)
    hold.park(cfg.name, "by the test")
    got: list[Held] = []
    errors: list[BaseException] = []

    def need(i: int) -> None:
        try:
            lease = process_lease(owner=f"run-{i}")
            got.append(Holding(StateStore()).bring_up(Swarm(cfg), lease, wait=True))
        except BaseException as exc:
            errors.append(exc)

    caplog.set_level(logging.INFO, logger="prefect_swarm.swarm")
    threads = [threading.Thread(target=need, args=(i,)) for i in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        restores = [r for r in caplog.records if r.getMessage().startswith(f"restoring swarm '{cfg.name}'")]
        assert len(restores) == 1, [r.getMessage() for r in restores]
        assert sorted(h.started for h in got) == [False, False, True]
        rec = hold.store.require_swarm(cfg.name)
        assert rec.phase is ServingPhase.RUNNING and rec.keep
        assert sorted(x.owner for x in hold.holders(cfg.name)) == ["keep", "run-0", "run-1", "run-2"]
        for i in range(3):
            assert hold.release(cfg.name, f"run-{i}")  # kept: the runs letting go leave it up
    finally:
        Swarm.from_state(cfg.name, hold.store).down()


def test_a_shard_for_a_parked_swarm_waits_for_the_restore_and_a_stop_ends_the_wait(tmp_path: Path) -> None:
    """What a flow run's shard task does on a parked swarm (:class:`~prefect_swarm.launch.ShardWatch`):
    it submits nothing while the swarm is parked, and the run's stop event (a cancel) ends its wait
    with ShardStopped; once the swarm is restored a shard submitted then runs to the end."""
    from prefect_swarm.exceptions import ShardStopped
    from prefect_swarm.launch import ShardWatch, for_swarm, plan_job

    hold = Holding(StateStore())
    cfg = stub_config(1, api_key=KEY)
    _kept(hold, cfg)
    n = 40
    pq.write_table(pa.table({"id": [f"r{i:03d}" for i in range(n)], "prompt": ["hi"] * n}), tmp_path / "in.parquet")
    asked = JobSpec(input=str(tmp_path / "in.parquet"), output=str(tmp_path / "out.parquet"), id_column="id", shards=1)
    said: list[str] = []
    outcome: list[BaseException | None] = []
    stop = threading.Event()
    try:
        swarm = Swarm.from_state(cfg.name, hold.store)
        spec = plan_job(for_swarm(asked, swarm), cfg.name).spec
        spec.save()
        came_up = hold.store.require_swarm(cfg.name).created_at
        hold.park(cfg.name, "by the test")
        watch = ShardWatch(swarm, spec, 0, store=hold.store, say=said.append)

        def submit() -> None:
            try:
                watch.submit(stop=stop)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        waiter = threading.Thread(target=submit)
        waiter.start()
        wait_until("the shard waiting for the restore", lambda: said, timeout_s=30)
        assert "is parked: waiting for its restore" in said[0], said
        assert not hold.store.require_job(str(spec.job_id)).submissions  # nothing sent to a parked swarm
        stop.set()
        waiter.join(30)
        assert len(outcome) == 1 and isinstance(outcome[0], ShardStopped), outcome
        assert not hold.store.require_job(str(spec.job_id)).submissions
        hold.restore(cfg.name)
        # a restore records the swarm as come up anew: how a shard the park stopped knows it was restored since
        assert hold.store.require_swarm(cfg.name).created_at != came_up
        again = ShardWatch(swarm, spec, 0, store=hold.store, say=said.append)
        probe = again.watch(threading.Event())
        assert again.outcome(probe)["done"] == n
    finally:
        Swarm.from_state(cfg.name, hold.store).down()
