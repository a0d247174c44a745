"""Local serving specifics (stub engine): reattach across processes, reconcile, ports, GPUs, capabilities."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import psutil
import pytest
from local_kit import stub_config, wait_for

from prefect_swarm.backends.local.serving import LocalServing
from prefect_swarm.exceptions import BackendError, ConfigError, ReadinessError
from prefect_swarm.interfaces import Capability, ServingPhase, check_config
from prefect_swarm.paths import SwarmPaths, read_json
from prefect_swarm.swarm import Swarm

_UP_IN_CHILD = """
import json, sys
from prefect_swarm.config import SwarmConfig
from prefect_swarm.swarm import Swarm
s = Swarm(SwarmConfig.model_validate(json.loads(sys.argv[1])))
s.up(); s.wait_ready()
print(json.dumps(s.handle.to_dict()))
"""


def _family(handle_meta: dict) -> list[psutil.Process]:
    procs = []
    for w in handle_meta["watchdogs"]:
        dog = psutil.Process(w["pid"])
        procs += [dog, *dog.children(recursive=True)]
    return procs


def test_swarm_brought_up_by_another_process_is_found_probed_and_torn_down() -> None:
    cfg = stub_config(replicas=2)
    argv = [sys.executable, "-c", _UP_IN_CHILD, json.dumps(cfg.redacted())]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    procs = _family(json.loads(out.stdout)["meta"])
    assert len(procs) == 4  # 2 watchdogs, 2 replicas; their parent process is gone
    swarm = Swarm.from_state(cfg.name)
    st = wait_for(swarm, lambda s: s.phase is ServingPhase.RUNNING)
    assert st.healthy == 2
    swarm.down()
    assert [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    assert swarm.status().phase is ServingPhase.STOPPED


def test_failing_replicas_stop_readiness_early_with_the_log_tail(local_swarm: Callable[..., Swarm]) -> None:
    # Readiness stops at the first replica that has failed for good (every replica ready can no longer
    # happen); under load the second one may not have used up its restarts yet, so either tail may lead.
    fail = ["{python}", "-c", "import sys; print('no such model: stub-model', flush=True); sys.exit(1)"]
    swarm = local_swarm(replicas=2, command=fail, ready=False, backend={"max_restarts": 1})
    t0 = time.monotonic()
    with pytest.raises(ReadinessError) as err:
        swarm.wait_ready(timeout_s=120)
    assert time.monotonic() - t0 < 20
    msg = str(err.value)
    assert ("replica 0" in msg or "replica 1" in msg) and "no such model: stub-model" in msg
    assert "Hint:" in msg


def test_taken_port_is_refused_before_anything_starts() -> None:
    cfg = stub_config(replicas=2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", cfg.port + 1))
        sock.listen()
        with pytest.raises(BackendError, match=f"port {cfg.port + 1}"):
            Swarm(cfg).up()
    paths = SwarmPaths.for_swarm(cfg.name)
    assert not paths.watchdog_pid(0).exists() and not paths.watchdog_pid(1).exists()


def test_up_again_with_fewer_replicas_stops_the_extra_ones(local_swarm: Callable[..., Swarm]) -> None:
    swarm = local_swarm(replicas=2)
    extra = _family({"watchdogs": swarm.handle.meta["watchdogs"][1:]})  # type: ignore[union-attr]
    keep = swarm.status().replicas[0].external_id
    smaller = Swarm(swarm.cfg.model_copy(update={"replicas": 1}))
    smaller.up()
    smaller.wait_ready()
    assert [p for p in extra if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    st = smaller.status()
    assert len(st.replicas) == 1 and st.replicas[0].external_id == keep
    smaller.down()


def test_up_again_with_a_changed_engine_restarts_replicas(local_swarm: Callable[..., Swarm]) -> None:
    swarm = local_swarm()
    old = swarm.status().replicas[0].external_id
    engine = swarm.cfg.engine.model_copy(update={"args": ["--latency-ms", "1"]})
    changed = Swarm(swarm.cfg.model_copy(update={"engine": engine}))
    changed.up()
    changed.wait_ready()
    assert changed.status().replicas[0].external_id != old
    changed.down()


def test_gpus_are_handed_out_per_replica() -> None:
    cfg = stub_config(replicas=2, gpus_per_replica=1, backend={"gpus": ["3", "5"]})
    backend = LocalServing(cfg, SwarmPaths.for_swarm(cfg.name))
    try:
        backend.create_or_update(cfg)
        envs = [read_json(backend.paths.watchdog_spec(i))["env"] for i in range(2)]
        assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3", "5"]
    finally:
        backend.delete(backend.create_or_update(cfg))


def test_too_few_gpus_is_a_config_error_before_anything_starts() -> None:
    cfg = stub_config(replicas=2, gpus_per_replica=1, backend={"gpus": ["0"]})
    with pytest.raises(ConfigError, match=r"backend\.gpus"):
        Swarm(cfg).up()
    assert not SwarmPaths.for_swarm(cfg.name).watchdog_pid(0).exists()


def test_capabilities_and_config_check() -> None:
    cfg = stub_config(replicas=4)
    caps = LocalServing(cfg, SwarmPaths.for_swarm(cfg.name)).capabilities()
    assert caps.supports(Capability.WATCHDOG) and caps.supports(Capability.WALL_TIME)
    assert caps.supports(Capability.DETACHED_JOBS)
    for cap in (Capability.MULTI_NODE, Capability.LOAD_BALANCER, Capability.PREEMPTION_SIGNAL, Capability.CONTAINERS):
        assert not caps.supports(cap) and caps.missing[cap]
    check_config(cfg, caps)  # 4 replicas on one machine are fine
    with pytest.raises(ConfigError, match="multi_node"):
        check_config(stub_config(replicas=2, replicas_per_node=1), caps)


def test_sglang_with_an_api_key_is_refused() -> None:
    cfg = stub_config(api_key="k").model_copy(
        update={"engine": stub_config().engine.model_copy(update={"kind": "sglang"})}
    )
    with pytest.raises(ConfigError, match="SGLang"):
        LocalServing(cfg, SwarmPaths.for_swarm(cfg.name)).create_or_update(cfg)


def test_delete_does_not_kill_a_recycled_pid(local_swarm: Callable[..., Swarm]) -> None:
    """A pid record whose create time does not match is someone else's process now: leave it alone."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    bystander = subprocess.Popen(sleeper, start_new_session=True)
    try:
        swarm = local_swarm(ready=False)
        fake = {"pid": bystander.pid, "create_time": psutil.Process(bystander.pid).create_time() - 100}
        swarm.paths.watchdog_pid(5).write_text(json.dumps(fake))
        swarm.down()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_status_without_watchdogs_is_stopped_not_stale_healthy(local_swarm: Callable[..., Swarm]) -> None:
    swarm = local_swarm()
    wait_for(swarm, lambda st: st.healthy >= 1)  # its watchdog's status file says Healthy: what must not be believed
    dog = swarm.handle.meta["watchdogs"][0]["pid"]  # type: ignore[union-attr]
    replica = int(swarm.status().replicas[0].external_id or 0)
    os.kill(dog, 9)  # the watchdog dies without a word; its status file still says Healthy
    psutil.Process(dog).wait(5)
    st = swarm.status()
    assert st.replicas[0].health.value == "Unknown"
    swarm.down()  # the orphaned replica is found through the status file
    assert not psutil.pid_exists(replica) or psutil.Process(replica).status() == psutil.STATUS_ZOMBIE
