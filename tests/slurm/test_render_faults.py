"""What the fault options render to, and how they are validated (no Slurm needed):
backend.port_range, backend.idle_timeout_s, the time limit against the signal; pick_port in a range."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from _slurmkit import stub_config
from pydantic import ValidationError

from prefect_swarm.backends.slurm import render
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.sidecar.ports import pick_port
from prefect_swarm.testing import free_port_block


def _plan(**backend: Any) -> tuple[str, str, dict[str, object]]:
    cfg = stub_config(backend=backend)
    paths = render.swarm_paths(cfg, SwarmPaths.for_swarm(cfg.name))
    return render.render_lb(cfg, paths), render.render_replicas(cfg, paths), render.watchdog_spec(cfg, paths, 0)


def test_port_range_reaches_the_lb_the_watchdogs_and_the_multi_node_ports() -> None:
    lb, _replicas, spec = _plan(port_range="20000-20099")
    assert "--pick-port \"$BIND\"" in lb and "--port-range 20000-20099)" in lb
    assert spec["port_range"] == [20000, 20099]
    multi = stub_config(gpus_per_replica=2, gpus_per_node=1, backend={"port_range": "21000-21009"})
    paths = render.swarm_paths(multi, SwarmPaths.for_swarm(multi.name))
    assert '--pick-port "$BIND" 0 --port-range 21000-21009; }' in render.render_replicas(multi, paths)
    lb, _replicas, spec = _plan()  # unset: nothing rendered
    assert "--port-range" not in lb and "port_range" not in spec


@pytest.mark.parametrize("bad", ["20000", "80-90", "30000-20000", "1024-70000", "a-b"])
def test_a_port_range_that_is_not_one_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(ValidationError, match="port_range") as err:
        stub_config(backend={"port_range": bad})
    assert "LOW-HIGH" in str(err.value)


def test_idle_timeout_reaches_the_reconciler_only_when_set() -> None:
    assert "--idle-timeout 45 &" in _plan(idle_timeout_s=45)[0]
    assert "--idle-timeout" not in _plan()[0]


def test_a_time_limit_within_the_signal_is_refused() -> None:
    with pytest.raises(ValidationError, match="time_limit") as err:
        stub_config(backend={"time_limit": "2", "signal_seconds": 90})
    assert "signal_seconds" in str(err.value)
    assert stub_config(backend={"time_limit": "2", "signal_seconds": 20}).backend.time_limit == "2"


def test_pick_port_stays_in_the_range_and_says_when_it_is_full() -> None:
    base = free_port_block(3)
    held = socket.socket()
    held.bind(("127.0.0.1", base))
    try:
        for _ in range(10):
            got = pick_port("127.0.0.1", base, [base, base + 2])  # the preferred one is taken
            assert base < got <= base + 2
        assert pick_port("127.0.0.1", base + 1, [base, base + 2]) == base + 1
        outside = base + 100  # never tried: not in the range
        assert base <= pick_port("127.0.0.1", outside, [base, base + 2]) <= base + 2  # preferred not in range
        with pytest.raises(OSError, match="port_range"):
            pick_port("127.0.0.1", None, [base, base])
    finally:
        held.close()
