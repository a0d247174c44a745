"""A swarm brought up from a SwarmSpec block keeps no secret in its record: a process that reattaches
to it without the secret in its environment gets it from the block, however it reattaches. The job
engine's own reattach (``launch``: a job's status, wait, cancel, budget) once built its holding by
hand without the block's secrets, so a job waited on from the CLI ran without the swarm's API key.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import SecretStr
from stack import PrefectStack

from prefect_swarm.config import SwarmConfig
from prefect_swarm.interfaces import JobStatus, ServingPhase
from prefect_swarm.state import JobRecord, StateStore, SwarmRecord
from prefect_swarm.swarm import Swarm, engine_fingerprint
from prefect_swarm.testing.stub_engine import stub_swarm_config

KEY = "k-only-in-the-block"


def _recorded_from_block(name: str) -> None:
    """Swarm ``name`` as a flow run leaves it: recorded (secrets dropped) with its block as source."""
    from prefect_swarm.blocks import SwarmSpec

    cfg = SwarmConfig.model_validate(stub_swarm_config(name)).model_copy(update={"api_key": SecretStr(KEY)})
    SwarmSpec.from_config(cfg).save(name, overwrite=True)
    record = SwarmRecord(
        name=name,
        backend="local",
        config=cfg.redacted(),
        phase=ServingPhase.RUNNING,
        handle={"name": name, "backend": "local"},
        fingerprint=engine_fingerprint(cfg),
        source=f"swarm-spec/{name}",
    )
    StateStore().put_swarm(record)


def test_a_jobs_reattach_in_launch_restores_the_blocks_secrets(prefect_api: PrefectStack, swarm_home: Path) -> None:
    import prefect_swarm.tasks  # noqa: F401  # the Prefect layer is in play, as in the CLI and in flow runs
    from prefect_swarm import launch

    _recorded_from_block("sec-launch")
    assert "PREFECT_SWARM_API_KEY" not in os.environ
    store = StateStore()
    rec = store.require_swarm("sec-launch")
    assert rec.config.get("api_key") is None and KEY not in str(rec.config)
    assert not Swarm.from_state("sec-launch").paths.api_key_file.exists()  # no key kept in its folder either

    job = JobRecord(id="j-sec", spec={}, status=JobStatus.RUNNING, swarm="sec-launch")
    compute = launch._job_compute(job)
    assert compute is not None
    api_key = compute.cfg.api_key  # type: ignore[attr-defined]  # the local compute backend's config
    assert api_key is not None and api_key.get_secret_value() == KEY
