"""`prefect-swarm logs NAME [--follow]` on a real local swarm of stub engines."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefect_swarm.config.loader import load_config
from prefect_swarm.swarm import Swarm


@pytest.mark.slow
def test_logs_prints_and_follows_a_local_replica_until_it_stops(
    run_cli: Callable[..., Any], follow_cli: Callable[..., Any], stub_swarm_config: Callable[..., Path]
) -> None:
    with Swarm(load_config(stub_swarm_config("logsy", replicas=2))) as swarm:  # up + wait_ready; down on exit
        log = swarm.paths.replica_log(1)  # the engine's stdout+stderr
        with log.open("a") as fh:
            fh.write("engine said: before\n")
        assert swarm.handle is not None
        assert "engine said" not in "".join(swarm.backends.serving.replica_log(swarm.handle, 0))  # its own log
        followed = follow_cli("logs", "logsy", "-r", "1", "--follow")
        followed.wait_for("engine said: before")
        with log.open("a") as fh:
            fh.write("engine said: after\n")
        followed.wait_for("engine said: after")
        bad = run_cli("logs", "logsy", "--replica", "2")
        assert bad.returncode == 2 and "--replica" in bad.stderr
    assert followed.proc.wait(30) == 0  # the swarm is down: following ends by itself
    assert followed.out.count("engine said: after") == 1
