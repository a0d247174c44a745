"""`prefect-swarm logs NAME [--follow]` on a real local swarm of stub engines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.slow
@pytest.mark.usefixtures("local_backend")
def test_logs_prints_and_follows_a_local_replica_until_it_stops(
    run_cli: Callable[..., Any],
    follow_cli: Callable[..., Any],
    stub_swarm_config: Callable[..., Path],
    swarm_home: Path,
) -> None:
    assert run_cli("up", "-c", str(stub_swarm_config("logsy", replicas=2))).returncode == 0
    log = swarm_home / "swarms" / "logsy" / "replica-1.log"  # the engine's stdout+stderr
    with log.open("a") as fh:
        fh.write("engine said: before\n")
    followed = follow_cli("logs", "logsy", "-r", "1", "--follow")
    followed.wait_for("engine said: before")
    with log.open("a") as fh:
        fh.write("engine said: after\n")
    followed.wait_for("engine said: after")
    assert run_cli("down", "logsy", "-y").returncode == 0
    assert followed.proc.wait(30) == 0  # the replica is gone: following ends by itself

    bad = run_cli("logs", "logsy", "--replica", "2")
    assert bad.returncode == 2 and "--replica" in bad.stderr
