"""prefect-swarm: a swarm of vLLM replicas behind one endpoint, batch jobs against it, as Prefect flows.

The top-level package stays import-light (no Prefect, no backends): the job process and the
backends import only what they need. The Prefect blocks are exposed lazily (PEP 562) so that
``prefect block register -m prefect_swarm`` finds them without this import paying for Prefect.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY_BLOCKS = ("LeptonBackend", "LocalBackend", "SlurmBackend", "SwarmSpec")

__all__ = ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY_BLOCKS:
        from prefect_swarm import blocks

        return getattr(blocks, name)
    raise AttributeError(f"module 'prefect_swarm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY_BLOCKS])
