"""Fakes shipped for users' tests and ours: a stub OpenAI engine, a fake Lepton API, free ports.

    python -m prefect_swarm.testing.stub_engine --port 8000      # an OpenAI-compatible stub engine
    python -m prefect_swarm.testing.fake_lepton                  # a loopback fake Lepton workspace API

Nothing here is used in production paths.
"""

from prefect_swarm.testing.ports import free_port, free_port_block

__all__ = ["free_port", "free_port_block"]
