"""Fakes shipped for users' tests and ours: a stub OpenAI engine, a fake Lepton API, free ports, and
the one way to wait on what the product writes (:func:`wait_until`).

    python -m prefect_swarm.testing.stub_engine --port 8000      # an OpenAI-compatible stub engine
    python -m prefect_swarm.testing.fake_lepton                  # a loopback fake Lepton workspace API

Nothing here is used in production paths.
"""

from prefect_swarm.testing.ports import free_port, free_port_block
from prefect_swarm.testing.waiting import WaitTimedOut, wait_until

__all__ = ["WaitTimedOut", "free_port", "free_port_block", "wait_until"]
