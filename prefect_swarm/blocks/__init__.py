"""Prefect Blocks for swarms: backend configs and a swarm spec, built FROM the config models.

Each block subclasses both :class:`prefect.blocks.core.Block` and its config model, so fields,
types, defaults, descriptions and validators have one source: ``prefect_swarm.config``.
``tests/prefect/test_blocks.py`` proves the two cannot drift.

    prefect block register -m prefect_swarm.blocks     # types appear in the UI catalog
    SwarmSpec.load("qwen").to_config()                 # -> SwarmConfig (secrets included)
"""

from prefect_swarm.blocks.core import (
    BACKEND_BLOCKS,
    ExternalBackend,
    LeptonBackend,
    LocalBackend,
    SlurmBackend,
    SwarmSpec,
    backend_block_for,
    with_secret_key,
)

__all__ = [
    "BACKEND_BLOCKS",
    "ExternalBackend",
    "LeptonBackend",
    "LocalBackend",
    "SlurmBackend",
    "SwarmSpec",
    "backend_block_for",
    "with_secret_key",
]

# a backend of the table that declares no block class in core gets the one made from its entry
globals().update({cls.__name__: cls for cls in BACKEND_BLOCKS.values()})
__all__ += sorted(cls.__name__ for cls in BACKEND_BLOCKS.values() if cls.__name__ not in __all__)
