"""`prefect-swarm scale NAME --replicas N` on a local swarm of stub engines: the same reconcile path
as `up --replicas N`, so the running replicas keep running (same pids)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.usefixtures("local_backend"), pytest.mark.slow]


def _json(result: Any) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def _pids(doc: dict[str, Any]) -> list[str]:
    return [r["external_id"] for r in doc["status"]["replicas"]]


def test_scale_adds_and_removes_replicas_and_keeps_the_running_ones(
    run_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path]
) -> None:
    path = stub_swarm_config("scaly", replicas=1)
    first = _pids(_json(run_cli("up", "-c", str(path), "-o", "json")))
    up = _json(run_cli("scale", "scaly", "--replicas", "3", "-o", "json"))
    assert up["status"]["healthy_replicas"] == 3 and up["swarm"]["replicas"] == 3
    three = _pids(up)
    assert three[0] == first[0], (first, three)
    down = _json(run_cli("scale", "scaly", "--replicas", "2", "-o", "json"))
    assert down["swarm"]["replicas"] == 2 and _pids(down) == three[:2]


def test_scale_of_a_swarm_that_is_not_up_is_refused(run_cli: Callable[..., Any]) -> None:
    result = run_cli("scale", "nope", "--replicas", "2")
    assert result.returncode == 3 and "nope" in result.stderr
