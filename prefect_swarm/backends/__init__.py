"""Backends: one folder each, where replicas serve (``serving``) and where job processes run
(``compute``); ``registry`` is the table of backends (each folder's ``config.ENTRY``).

Nothing here imports prefect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_swarm import lazy_names

if TYPE_CHECKING:
    from prefect_swarm.backends.entry import BackendEntry
    from prefect_swarm.backends.registry import BUILTIN, ENTRIES, BackendPair, build_backends, entry_of

__all__ = ["BUILTIN", "ENTRIES", "BackendEntry", "BackendPair", "build_backends", "entry_of"]


_WHERE = {**dict.fromkeys(__all__, "prefect_swarm.backends.registry"), "BackendEntry": "prefect_swarm.backends.entry"}

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
