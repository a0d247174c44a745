"""prefect-swarm: a swarm of vLLM replicas behind one endpoint, batch jobs against it, as Prefect flows.

The top-level package stays import-light (no Prefect, no backends): the job process and the
backends import only what they need. The Prefect blocks are exposed lazily (PEP 562) so that
``prefect block register -m prefect_swarm`` finds them without this import paying for Prefect.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__"]


def lazy_names(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose names (keys of ``where``, each defined in the
    module it maps to) are imported on first use (PEP 562). A package's ``__init__`` then costs
    nothing: a process that needs one of its modules (a job process, a sidecar, one CLI command)
    does not import the others' dependencies (pyarrow, aiohttp, httpx, pydantic-settings, YAML)."""
    namespace = importlib.import_module(package).__dict__

    def getattr_(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted([*namespace, *where])

    return getattr_, dir_


class _Blocks(Mapping[str, str]):
    """The blocks exported here -> ``prefect_swarm.blocks``: ``SwarmSpec`` and each backend's
    ``<Title>Backend``, read from the table of backends when first asked. A name that cannot be a
    block (a submodule) does not load the table, so this package's import stays light."""

    def _names(self) -> list[str]:
        from prefect_swarm.backends.registry import ENTRIES

        return ["SwarmSpec", *(entry.block for entry in ENTRIES.values())]

    def __getitem__(self, name: str) -> str:
        if name in self:
            return "prefect_swarm.blocks"
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name == "SwarmSpec" or name.endswith("Backend")) and name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


__getattr__, __dir__ = lazy_names(__name__, _Blocks())

from prefect_swarm.interfaces.jobenv import HOME, env_value  # noqa: E402  (stdlib only; needs lazy_names above)

if env_value(HOME) and not os.environ.get("PREFECT_HOME"):  # (the rule's cheap half)
    from prefect_swarm.paths import keep_prefect_off_home

    keep_prefect_off_home()
