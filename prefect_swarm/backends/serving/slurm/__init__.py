"""The Slurm serving backend.

``client`` talks to Slurm, ``render`` writes scripts (pure), ``backend`` implements the protocol.
"""

from prefect_swarm.backends.serving.slurm.backend import SlurmServing
from prefect_swarm.backends.serving.slurm.render import render_plan

__all__ = ["SlurmServing", "render_plan"]
