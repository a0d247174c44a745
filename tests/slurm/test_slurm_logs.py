"""`prefect-swarm logs --follow` on the real Slurm: a replica's log on the shared run dir, followed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from _slurmkit import stub_config

from prefect_swarm.swarm import Swarm

pytestmark = [pytest.mark.slurm]


def test_logs_follows_a_slurm_replica(need_slurm: None, follow_cli: Callable[..., Any]) -> None:
    with Swarm(stub_config(replicas=1)) as swarm:  # up + wait_ready; down on exit
        name, log = swarm.cfg.name, swarm.paths.replica_log(0)
        with log.open("a") as fh:
            fh.write("slurm replica said: before\n")
        assert swarm.handle is not None
        assert "slurm replica said: before" in "".join(swarm.backends.serving.replica_log(swarm.handle, 0))
        followed = follow_cli("logs", name, "--follow")
        followed.wait_for("slurm replica said: before")
        with log.open("a") as fh:
            fh.write("slurm replica said: after\n")
        followed.wait_for("slurm replica said: after")
        assert followed.stop() == 0
