"""The local backend with the real vLLM (CPU build, tiny model): one module-scoped swarm of 2 replicas.

Tests run in file order on the same swarm: up -> chat -> SIGKILL a replica (the watchdog restarts it)
-> down leaves no process. The machine has 2 cores, so this is the only vLLM swarm of the suite.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
import services

from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import ReplicaHealth, ServingPhase
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm_swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swarm]:
    """Two vLLM replicas under watchdogs, ready; brought down at the end of the module."""
    services.gate(services.missing_vllm())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_SWARM_HOME", str(tmp_path_factory.mktemp("vllm-home")))
        cfg = SwarmConfig.model_validate(
            services.vllm_swarm_config("vllm-pair", replicas=2, health_interval_s=1.0, restart_backoff_s=0.5)
        )
        swarm = Swarm(cfg)
        t0 = time.monotonic()
        try:
            swarm.up()
            swarm.wait_ready()
            print(f"\nvLLM swarm of 2 replicas ready in {time.monotonic() - t0:.1f}s")
            yield swarm
        finally:
            swarm.down()


def _chat(url: str) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    resp.raise_for_status()
    return dict(resp.json())


def _wait_status(swarm: Swarm, ok: object, timeout_s: float) -> None:
    wait_until("the swarm's status to match", swarm.status, until=ok, timeout_s=timeout_s, poll_s=1)  # type: ignore[arg-type]


def test_two_replicas_running(vllm_swarm: Swarm) -> None:
    st = wait_until(  # the watchdogs have seen the replicas healthy
        "2 healthy replicas", vllm_swarm.status, until=lambda st: st.healthy == 2, timeout_s=60, poll_s=0.5
    )
    assert st.phase is ServingPhase.RUNNING, st
    assert st.healthy == 2
    assert all(r.external_id for r in st.replicas)


def test_chat_completion_through_the_swarm(vllm_swarm: Swarm) -> None:
    assert len(vllm_swarm.endpoints) == 2
    for url in vllm_swarm.endpoints:
        out = _chat(url)
        assert out["choices"] and out["model"] == "tiny"


def test_sigkill_of_a_replica_is_restarted(vllm_swarm: Swarm) -> None:
    victim = vllm_swarm.status().replicas[1]
    assert victim.external_id
    psutil.Process(int(victim.external_id)).kill()
    _wait_status(vllm_swarm, lambda st: st.replicas[1].restarts >= 1, 30)
    t0 = time.monotonic()
    _wait_status(vllm_swarm, lambda st: st.replicas[1].health is ReplicaHealth.HEALTHY, 400)
    print(f"\nvLLM replica restarted and healthy in {time.monotonic() - t0:.1f}s")
    st = vllm_swarm.status()
    assert st.replicas[1].external_id != victim.external_id
    assert st.phase is ServingPhase.RUNNING
    assert _chat(vllm_swarm.endpoints[1])["choices"]


def test_down_leaves_no_process(vllm_swarm: Swarm) -> None:
    procs: list[psutil.Process] = []
    for w in vllm_swarm.handle.meta["watchdogs"]:  # type: ignore[union-attr]
        procs.append(psutil.Process(w["pid"]))
    for r in vllm_swarm.status().replicas:
        leader = psutil.Process(int(r.external_id or 0))
        procs += [leader, *leader.children(recursive=True)]
    assert len(procs) >= 4
    vllm_swarm.down()
    still = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert still == [], still
    assert vllm_swarm.status().phase is ServingPhase.STOPPED
