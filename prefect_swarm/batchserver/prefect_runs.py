"""A batch as a Prefect deployment run: started, looked at and cancelled through the Prefect API.

Used when the service's config names a deployment (``prefect_deployment``, e.g.
``batch-inference/on-demand``) and a Prefect API is configured: the batch then shows in the UI with
its history, and the run (on a worker) brings up or shares the model's swarm and runs the job. The
run is created with the batch id as its idempotency key and its name, so a service restarted between
the request and recording the answer finds the same run, never a second one.
"""

from __future__ import annotations

import uuid
from typing import Any

FINAL_FAILED = frozenset({"FAILED", "CRASHED", "CANCELLED"})
"""Flow run state types after which no job will run for the batch."""


def start_run(deployment: str, batch_id: str, parameters: dict[str, Any], job_variables: dict[str, Any]) -> str:
    """Create the deployment run for ``batch_id`` (or find the one created before); return its id."""
    from prefect.deployments import run_deployment

    run: Any = run_deployment(  # called from a thread without an event loop: the run itself, not a coroutine
        deployment,
        parameters=parameters,
        flow_run_name=batch_id,
        idempotency_key=batch_id,
        job_variables=job_variables or None,
        tags=["batch-service"],
        timeout=0,
        as_subflow=False,
    )
    return str(run.id)


def run_state(flow_run_id: str) -> str:
    """The run's state type now (``SCHEDULED``, ``RUNNING``, ``COMPLETED``, ``FAILED``...)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(uuid.UUID(flow_run_id)).state
    return state.type.value if state is not None else "SCHEDULED"


def cancel_run(flow_run_id: str) -> None:
    """Ask Prefect to cancel the run (its worker stops it; the run's hooks let go of its swarm)."""
    from prefect import get_client
    from prefect.states import Cancelling

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(uuid.UUID(flow_run_id)).state
        if state is None or not state.is_final():
            client.set_flow_run_state(uuid.UUID(flow_run_id), Cancelling(), force=True)


def api_configured() -> bool:
    """A Prefect API is configured (``PREFECT_API_URL`` or the profile's)."""
    from prefect_swarm.tasks.flow_runs import api_url

    return api_url() is not None
