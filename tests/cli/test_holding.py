"""Holding a swarm from several processes at once (prefect_swarm.holding), on real local swarms of
stub engines: a stop is idempotent, a bring-up happens once, a holder nobody can ask about is gone
once its process is.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from prefect_swarm.holding import Holding
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.state import StateStore, flow_run_lease
from prefect_swarm.testing.stub_engine import STUB_MODULE

pytestmark = [pytest.mark.usefixtures("local_backend")]


def _at_once(args: list[str], n: int = 3, timeout: float = 120) -> list[subprocess.CompletedProcess[str]]:
    """Run ``prefect-swarm ARGS`` ``n`` times concurrently; their results."""
    env = {**os.environ, "COLUMNS": "200", "PREFECT_API_URL": ""}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "prefect_swarm.cli.main", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


def _engines(config: Path) -> list[psutil.Process]:
    """The stub engine processes serving the ports of the swarm ``config`` describes."""
    cfg = yaml.safe_load(config.read_text())
    ports = {str(cfg["port"] + i) for i in range(cfg["replicas"])}
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info.get("cmdline") or []
        if STUB_MODULE in argv and any(a == "--port" and b in ports for a, b in itertools.pairwise(argv)):
            found.append(proc)
    return found


def test_three_concurrent_ups_then_downs(stub_swarm_config: Callable[..., Path]) -> None:
    """Three `up` at once: one bring-up, one engine per replica, each under its watchdog; three
    `down -y` at once: all exit 0 (a second stop waits for the first) and the swarm ends STOPPED."""
    path = stub_swarm_config("crowd", replicas=2)
    ups = _at_once(["up", "-c", str(path), "-o", "json"])
    assert [u.returncode for u in ups] == [0, 0, 0], [u.stderr for u in ups]
    engines = _engines(path)
    assert len(engines) == 2, [e.info["cmdline"] for e in engines]
    for engine in engines:
        assert "prefect_swarm.sidecar.watchdog" in " ".join(engine.parent().cmdline())
    assert [x.owner for x in StateStore().list_leases("crowd")] == ["keep"]

    downs = _at_once(["down", "crowd", "-y"])
    assert [d.returncode for d in downs] == [0, 0, 0], [d.stderr for d in downs]
    assert StateStore().require_swarm("crowd").phase is ServingPhase.STOPPED
    assert StateStore().list_leases("crowd") == []
    psutil.wait_procs(engines, timeout=15)
    assert not any(e.is_running() and e.status() != psutil.STATUS_ZOMBIE for e in engines)


def test_a_flow_run_nobody_can_ask_about_no_longer_holds_the_swarm(
    run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path]
) -> None:
    """A flow run on Prefect's temporary server ended without letting go: with no API to ask,
    `down -y` judges its hold by its process (gone) and stops the swarm, no --force needed."""
    path = stub_swarm_config("temp-server", replicas=1)
    assert run_cli("up", "-c", str(path), "-o", "json").returncode == 0
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    Holding().hold("temp-server", dataclasses.replace(flow_run_lease("c0ffee"), pid=gone.pid))
    down = run_cli("down", "temp-server", "-y", env={"PREFECT_API_URL": ""})
    assert down.returncode == 0, down.stderr
    assert StateStore().require_swarm("temp-server").phase is ServingPhase.STOPPED
