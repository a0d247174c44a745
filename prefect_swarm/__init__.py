"""prefect-swarm: a swarm of vLLM replicas behind one endpoint, batch jobs against it, as Prefect flows.

The top-level package stays import-light (no Prefect, no backends): the job process and the
backends import only what they need.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
