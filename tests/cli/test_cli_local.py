"""The CLI against real local swarms of stub engines: up, status, list, describe, down, prune.

Every command runs as its own process, as a user would run it: `status` and `down` find the swarm
that another process brought up by its name alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.usefixtures("local_backend"), pytest.mark.slow]


def _json(result: Any) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def _wait_status(run_cli: Callable[..., Any], name: str, healthy: int, timeout: float = 30) -> dict[str, Any]:
    """`status -o json` until ``healthy`` replicas report healthy (watchdogs write every couple of s)."""
    return wait_until(
        f"{healthy} healthy replicas of {name}",
        lambda: _json(run_cli("status", name, "-o", "json", "--no-history")),
        until=lambda doc: doc["status"]["healthy_replicas"] == healthy,
        timeout_s=timeout,
        poll_s=0.5,
    )


def _pids(doc: dict[str, Any]) -> list[int]:
    return [int(r["external_id"]) for r in doc["status"]["replicas"] if r.get("external_id")]


def test_up_status_list_describe_down(
    run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path], swarm_home: Path
) -> None:
    path = stub_swarm_config("stubby", replicas=2)
    up = _json(run_cli("up", "-c", str(path), "-o", "json"))
    assert up["schema_version"] == 1
    assert up["swarm"]["name"] == "stubby" and up["swarm"]["phase"] == "RUNNING"
    assert up["status"]["healthy_replicas"] == 2

    status = _wait_status(run_cli, "stubby", healthy=2)  # another process, by name only
    assert status["schema_version"] == 1
    assert status["status"]["phase"] == "RUNNING"
    assert status["status"]["healthy_replicas"] == 2
    assert [r["health"] for r in status["status"]["replicas"]] == ["Healthy", "Healthy"]
    assert status["swarm"]["endpoint"].startswith("http://127.0.0.1:")
    assert set(status) >= {"schema_version", "swarm", "status", "prefect"}
    pids = _pids(status)
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)

    listed = _json(run_cli("list", "-o", "json"))
    assert [s["name"] for s in listed["swarms"]] == ["stubby"]
    assert listed["swarms"][0]["replicas"] == 2

    desc = _json(run_cli("describe", "stubby", "-o", "json"))
    assert desc["config"]["name"] == "stubby" and desc["config"]["api_key"] is None
    assert desc["handle"]["backend"] == "local"
    assert Path(desc["paths"]["root"]) == swarm_home / "swarms" / "stubby"
    assert len(desc["paths"]["replicas"]) == 2

    down = run_cli("down", "stubby", "-y")
    assert down.returncode == 0, down.stderr
    _gone(pids)
    after = _json(run_cli("status", "stubby", "-o", "json"))
    assert after["swarm"]["phase"] == "STOPPED"

    pruned = _json(run_cli("db", "prune", "-y", "-o", "json"))
    assert [r["name"] for r in pruned["removed"]] == ["stubby"]
    assert _json(run_cli("list", "-o", "json"))["swarms"] == []


def _gone(pids: list[int], timeout: float = 15) -> None:
    wait_until(
        "replica processes to end after `down`",
        lambda: [p for p in pids if _alive(p)],
        until=lambda left: not left,
        timeout_s=timeout,
    )


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_status_and_down_from_a_different_process(
    run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path]
) -> None:
    path = stub_swarm_config("other-proc", replicas=1)
    up = run_cli("up", "-c", str(path), "--name", "found-by-name", "-o", "json")
    assert up.returncode == 0, up.stderr
    status = _wait_status(run_cli, "found-by-name", healthy=1)
    assert status["swarm"]["name"] == "found-by-name" and status["status"]["healthy_replicas"] == 1
    pids = _pids(status)
    down = run_cli("down", "found-by-name", "-y")
    assert down.returncode == 0, down.stderr
    _gone(pids)


def test_failed_up_tears_down_and_exits_not_ready(
    run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path], swarm_home: Path
) -> None:
    path = stub_swarm_config(
        "broken",
        replicas=1,
        ready_timeout_s=20,
        engine={
            "kind": "command",
            "command": ["{python}", "-c", "import sys; sys.exit(3)"],
            "startup_timeout_s": 20,
        },
    )
    result = run_cli("up", "-c", str(path), timeout=120)
    assert result.returncode in (1, 4), result.stderr
    assert "Traceback" not in result.stderr
    assert "tearing down" in result.stderr
    doc = _json(run_cli("status", "broken", "-o", "json", "--no-history"))
    assert doc["swarm"]["phase"] == "STOPPED"


def test_validate_prints_the_plan_and_starts_nothing(
    run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path], swarm_home: Path
) -> None:
    path = stub_swarm_config("planned", replicas=2)
    result = run_cli("validate", "-c", str(path), "-o", "json")
    doc = _json(result)
    replicas = [json.loads(doc["plan"][f"watchdog-{i}.json"]) for i in range(2)]
    ports = [int(r["url"].rsplit(":", 1)[1]) for r in replicas]
    assert ports[1] == ports[0] + 1
    assert "prefect_swarm.testing.stub_engine" in replicas[0]["argv"]
    text = run_cli("validate", "-c", str(path))
    assert text.returncode == 0 and "would start" in text.stdout
    assert not (swarm_home / "state.db").exists() and not (swarm_home / "swarms").exists()


def test_secrets_stay_out_of_output(run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path]) -> None:
    path = stub_swarm_config("secretive", replicas=1, api_key="sk-do-not-print-me")
    result = run_cli("validate", "-c", str(path), "-o", "json")
    assert result.returncode == 0, result.stderr
    assert "sk-do-not-print-me" not in result.stdout + result.stderr


def test_down_leaves_a_swarm_a_live_user_holds_unless_forced(
    run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path]
) -> None:
    import dataclasses
    import os
    import subprocess
    import sys

    from prefect_swarm.state import StateStore, process_lease

    path = stub_swarm_config("held", replicas=1)
    assert run_cli("up", "-c", str(path), "-o", "json").returncode == 0
    pids = _pids(_wait_status(run_cli, "held", healthy=1))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        lease = dataclasses.replace(process_lease(), swarm="held", owner=f"pid:test:{holder.pid}", pid=holder.pid)
        StateStore().put_lease(lease)
        refused = run_cli("down", "held", "-y")
        assert refused.returncode != 0 and f"pid:test:{holder.pid}" in refused.stderr and "--force" in refused.stderr
        assert _json(run_cli("status", "held", "-o", "json", "--no-history"))["status"]["healthy_replicas"] == 1
        holder.kill()
        holder.wait()
        # its holder is gone: the lease is reaped and the swarm stops (no --force needed)
        assert run_cli("down", "held", "-y").returncode == 0
        _gone(pids)
        assert StateStore().list_leases("held") == []
        # and --force stops one whatever holds it
        assert run_cli("up", "-c", str(path), "-o", "json").returncode == 0
        pids = _pids(_wait_status(run_cli, "held", healthy=1))
        StateStore().put_lease(dataclasses.replace(lease, pid=os.getpid()))
        assert run_cli("down", "held", "-y", "--force").returncode == 0
        _gone(pids)
    finally:
        holder.kill()


def test_up_again_reconciles_a_live_swarm_without_restarting_it(
    run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path]
) -> None:
    """`up` on a live swarm scales it (2 -> 3 -> 2) and keeps the replicas that were healthy."""
    path = stub_swarm_config("rescale", replicas=2)
    assert run_cli("up", "-c", str(path), "-o", "json").returncode == 0
    before = _pids(_wait_status(run_cli, "rescale", healthy=2))
    grown = _json(run_cli("up", "-c", str(path), "--replicas", "3", "-o", "json"))
    assert grown["status"]["healthy_replicas"] == 3
    now = _pids(_wait_status(run_cli, "rescale", healthy=3))
    assert now[:2] == before and len(now) == 3, (before, now)  # the first two were not restarted
    shrunk = _json(run_cli("up", "-c", str(path), "--replicas", "2", "-o", "json"))
    assert shrunk["status"]["healthy_replicas"] == 2
    assert _pids(_wait_status(run_cli, "rescale", healthy=2)) == before
    assert not psutil.pid_exists(now[2]) or psutil.Process(now[2]).status() == psutil.STATUS_ZOMBIE
    assert _json(run_cli("describe", "rescale", "-o", "json"))["config"]["replicas"] == 2
