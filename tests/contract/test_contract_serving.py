"""ServingBackend contract: what every backend must do, checked by behaviour (runs once per backend)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest
from contract_kit import BOOM, BackendFactory, run_py

from prefect_swarm.exceptions import ConfigError, ReadinessError
from prefect_swarm.interfaces import Capability, ReplicaHealth, ServingPhase
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.waiting import WaitTimedOut, wait_until


def _gone(factory: BackendFactory, swarm: Swarm) -> list[str]:
    """What still runs of ``swarm`` once the backend had up to stop_timeout_s to stop it."""
    try:
        wait_until(
            "nothing of the swarm left",
            lambda: factory.leftovers(swarm),
            until=lambda left: not left,
            timeout_s=factory.stop_timeout_s,
            poll_s=0.5,
        )
    except WaitTimedOut:
        return factory.leftovers(swarm)
    return []


def _chat(url: str, model: str) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    resp.raise_for_status()
    return dict(resp.json())


def test_up_ready_status_down(factory: BackendFactory, up: Callable[..., Swarm]) -> None:
    swarm = up(replicas=2)
    st = swarm.status()
    assert st.phase is ServingPhase.RUNNING, st
    assert st.healthy == 2 and len(st.replicas) == 2
    for url in swarm.endpoints:
        assert _chat(url, swarm.cfg.model_name)["choices"]
    assert factory.leftovers(swarm), "a running swarm must show up in leftovers()"
    swarm.down()
    assert _gone(factory, swarm) == []
    assert swarm.status().phase in (ServingPhase.STOPPED, ServingPhase.UNKNOWN)


def test_create_or_update_twice_does_not_duplicate(factory: BackendFactory, up: Callable[..., Swarm]) -> None:
    swarm = up(replicas=2)
    before = sorted(factory.leftovers(swarm))
    ids_before = [r.external_id for r in swarm.status().replicas]
    again = Swarm(swarm.cfg)  # a second `up` of the same config, as another process would do
    handle = again.up()
    again.wait_ready()
    assert handle.meta.get("replica_urls") == swarm.handle.meta.get("replica_urls")  # type: ignore[union-attr]
    assert sorted(factory.leftovers(swarm)) == before
    assert [r.external_id for r in again.status().replicas] == ids_before


def test_delete_is_idempotent(factory: BackendFactory, up: Callable[..., Swarm]) -> None:
    swarm = up()
    swarm.down()
    swarm.down()
    Swarm.from_state(swarm.cfg.name).down()
    assert _gone(factory, swarm) == []


def test_delete_right_after_create(factory: BackendFactory, up: Callable[..., Swarm]) -> None:
    swarm = up(replicas=2, ready=False)
    swarm.down()
    time.sleep(1.0)  # anything launched late would show up now
    assert _gone(factory, swarm) == []


def test_delete_with_a_failing_engine(factory: BackendFactory, up: Callable[..., Swarm]) -> None:
    swarm = up(replicas=2, engine="fail", ready=False)
    time.sleep(1.0)  # let it fail and restart at least once
    swarm.down()
    assert _gone(factory, swarm) == []


def test_readiness_fails_early_with_the_log_tail(factory: BackendFactory, up: Callable[..., Swarm]) -> None:
    swarm = up(replicas=2, engine="fail", ready=False)
    t0 = time.monotonic()
    with pytest.raises(ReadinessError) as err:
        swarm.wait_ready(timeout_s=factory.ready_timeout_s * 2)
    assert time.monotonic() - t0 < factory.ready_timeout_s, "must stop early, not at the timeout"
    assert BOOM in str(err.value)
    assert swarm.store.require_swarm(swarm.cfg.name).phase == ServingPhase.FAILED.value


def test_readiness_times_out_on_a_dead_endpoint(factory: BackendFactory, up: Callable[..., Swarm]) -> None:
    swarm = up(engine="blackhole", ready=False)
    t0 = time.monotonic()
    with pytest.raises(ReadinessError, match="not ready after"):
        swarm.wait_ready(timeout_s=3)
    assert time.monotonic() - t0 < 3 + 10


def test_status_never_blocks_on_a_dead_endpoint(factory: BackendFactory, up: Callable[..., Swarm]) -> None:
    swarm = up(engine="blackhole", ready=False)
    for _ in range(3):
        t0 = time.monotonic()
        st = swarm.status()
        assert time.monotonic() - t0 < factory.status_budget_s
        assert st.phase is not ServingPhase.RUNNING
        assert all(r.health is not ReplicaHealth.HEALTHY for r in st.replicas)
        time.sleep(0.5)
    swarm.down()
    t0 = time.monotonic()
    swarm.status()
    assert time.monotonic() - t0 < factory.status_budget_s


_REATTACH = """
import json, sys
from prefect_swarm.swarm import Swarm
s = Swarm.from_state(sys.argv[1])
st = s.status()
print(json.dumps({"phase": st.phase.value, "healthy": st.healthy, "url": s.endpoint}))
s.down()
print(json.dumps({"phase": s.status().phase.value}))
"""


def test_reattach_from_a_new_process(factory: BackendFactory, up: Callable[..., Swarm]) -> None:
    swarm = up(replicas=2)
    first, second = (json.loads(line) for line in run_py(_REATTACH, swarm.cfg.name).splitlines())
    assert first == {"phase": "RUNNING", "healthy": 2, "url": swarm.endpoint}
    assert second["phase"] in ("STOPPED", "UNKNOWN")
    assert _gone(factory, swarm) == []
    assert swarm.store.require_swarm(swarm.cfg.name).phase == ServingPhase.STOPPED.value


def test_context_manager_tears_down_on_error(factory: BackendFactory) -> None:
    swarm = Swarm(factory.config(replicas=1))
    with pytest.raises(RuntimeError, match="inside the block"), swarm:
        assert swarm.status().phase is ServingPhase.RUNNING
        raise RuntimeError("inside the block")
    assert _gone(factory, swarm) == []


def test_context_manager_tears_down_when_never_ready(factory: BackendFactory) -> None:
    swarm = Swarm(factory.config(replicas=1, engine="fail"))
    with pytest.raises(ReadinessError), swarm:
        pytest.fail("the body must not run")
    assert _gone(factory, swarm) == []


def test_park_gives_every_gpu_back_and_the_next_up_restores_it(
    factory: BackendFactory, up: Callable[..., Swarm]
) -> None:
    """A backend with the park capability: parked, nothing of the swarm holds a GPU and it reads PARKED;
    the next ``up`` restores it and every endpoint answers. One without it refuses with its reason and
    stops nothing."""
    swarm = up(replicas=2)
    caps = swarm.backends.serving.capabilities()
    held = factory.holding_gpus or factory.leftovers
    if not caps.supports(Capability.PARK):
        with pytest.raises(ConfigError, match=caps.missing[Capability.PARK].split(";")[0]):
            swarm.park("contract")
        assert held(swarm)
        return
    swarm.park("contract")
    wait_until(
        "every GPU given back",
        lambda: held(swarm),
        until=lambda h: h == [],
        timeout_s=factory.stop_timeout_s,
        poll_s=0.5,
    )
    assert swarm.status().phase is ServingPhase.PARKED
    again = Swarm(swarm.cfg)  # the next holder, as another process would be
    again.up()
    again.wait_ready()
    assert again.status().phase is ServingPhase.RUNNING
    for url in again.endpoints:
        assert _chat(url, swarm.cfg.model_name)["choices"]
