"""Prefect flows composed of the tasks in ``prefect_swarm.tasks``.

batch_inference   plan -> up -> ready -> map shards -> commit -> down
swarm_up          bring a swarm up and keep it
swarm_park        give back a swarm's GPUs, keep its snapshot (PARKED)
swarm_restore     bring a parked swarm back from its snapshot
swarm_down        stop a swarm
run_job           a batch job on an existing swarm
pipeline          stages of batch jobs, each on its own swarm, each over the stage before it
reap_orphans      on a crash (and a schedule, inactive by default): stop swarms whose flow run ended
failed_rows_notice  the example automation's action: a job committed with failed rows
"""

import sys
import types
from typing import TYPE_CHECKING

from prefect_swarm import lazy_names

if TYPE_CHECKING:
    from prefect_swarm.flows.batch import batch_inference
    from prefect_swarm.flows.notify import failed_rows_notice
    from prefect_swarm.flows.params import JobOptions
    from prefect_swarm.flows.pipeline import Stage, pipeline
    from prefect_swarm.flows.reaper import reap_orphans_flow
    from prefect_swarm.flows.swarm import run_job, swarm_down, swarm_park, swarm_restore, swarm_up

# Loaded on first use (PEP 562): a flow run imports its own entrypoint's module (each module's flows
# and their parameter schemas cost a few hundred ms of CPU to build), not every flow of the package.
_WHERE: dict[str, str] = {
    "JobOptions": "prefect_swarm.flows.params",
    "Stage": "prefect_swarm.flows.pipeline",
    "batch_inference": "prefect_swarm.flows.batch",
    "failed_rows_notice": "prefect_swarm.flows.notify",
    "pipeline": "prefect_swarm.flows.pipeline",
    "reap_orphans_flow": "prefect_swarm.flows.reaper",
    "run_job": "prefect_swarm.flows.swarm",
    "swarm_down": "prefect_swarm.flows.swarm",
    "swarm_park": "prefect_swarm.flows.swarm",
    "swarm_restore": "prefect_swarm.flows.swarm",
    "swarm_up": "prefect_swarm.flows.swarm",
}

__all__ = [
    "JobOptions",
    "Stage",
    "batch_inference",
    "failed_rows_notice",
    "pipeline",
    "reap_orphans_flow",
    "run_job",
    "swarm_down",
    "swarm_park",
    "swarm_restore",
    "swarm_up",
]

__getattr__, __dir__ = lazy_names(__name__, _WHERE)


class _Flows(types.ModuleType):
    """This package, whose name ``pipeline`` is the flow, not the module that defines it: importing
    ``prefect_swarm.flows.pipeline`` (a deployment's entrypoint, ``from prefect_swarm.flows.pipeline
    import Stage``) would otherwise bind the module to that name, and a later ``from prefect_swarm.flows
    import pipeline`` would get the module. The submodule stays in ``sys.modules``."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}" and name in _WHERE:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Flows
