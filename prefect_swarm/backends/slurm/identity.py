"""The swarm's own API key: a closed endpoint by default on a shared cluster.

A Slurm swarm without ``api_key`` (and without ``backend.open_endpoint: true``) gets a random key
of its own at its first ``up``, kept in ``<run dir>/swarm.key`` (mode 0600, this user's only). It
is never written to the state database, a rendered script or a log, and never on a command line:

* ``up`` passes it to the replica and LB jobs in the sbatch process environment (exported by name,
  ``backend.export``), where the engines require it (``PREFECT_SWARM_API_KEY`` / ``VLLM_API_KEY``)
  and the LB's reconciler hands it on to a replica it resubmits;
* every later process of this user (``job submit``, a flow run, readiness probes) reads the file
  and puts the key in the environment of its job steps as ``PREFECT_SWARM_API_KEY`` (JobEnv), like
  an ``api_key`` set in the config.

Another user's process cannot read the file, so it can neither use the swarm's replicas nor pass
as one of them (readiness sends the key).
"""

from __future__ import annotations

import os
import secrets
import time
from typing import TYPE_CHECKING

from pydantic import SecretStr

from prefect_swarm.backends.slurm.render import slurm_section
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.paths import read_secret as _read_secret

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.paths import SwarmPaths


def generated(cfg: SwarmConfig) -> bool:
    """True when the swarm's key is generated (no ``api_key``, endpoint not opened)."""
    return cfg.api_key is None and not slurm_section(cfg).open_endpoint


def read_key(paths: SwarmPaths) -> str | None:
    """The key in ``paths.api_key_file``; None when there is none. A file others can read is refused."""
    return _read_secret(paths.api_key_file, "the swarm's API key")


def ensure_key(paths: SwarmPaths) -> str:
    """The swarm's key, created (random, mode 0600) when it has none yet."""
    return _ensure_secret(paths, paths.api_key_file, "the swarm's API key")


def ensure_ray_token(paths: SwarmPaths) -> str:
    """The token of the swarm's Ray clusters, created (random, mode 0600) when it has none yet.

    Every replica spanning several nodes starts Ray with ``RAY_AUTH_MODE=token`` and
    ``RAY_AUTH_TOKEN_PATH`` naming this file (backends/slurm/templates/replicas.sbatch.j2): a process without the
    token (another user's ``ray start --address=...``) is refused by the GCS and the raylets. It is
    made whether or not the endpoint is open: Ray runs code, the endpoint only answers prompts.
    """
    return _ensure_secret(paths, paths.ray_token_file, "the swarm's Ray token", secrets.token_hex)


def _ensure_secret(paths: SwarmPaths, path: Path, what: str, make: Callable[[int], str] = secrets.token_urlsafe) -> str:
    """The secret in ``path``, created (random, mode 0600) when there is none yet."""
    secret = _read_secret(path, what)
    if secret:
        return secret
    paths.ensure()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another `up` is making it: wait for its write
        for _ in range(50):
            secret = _read_secret(path, what)
            if secret:
                return secret
            time.sleep(0.1)
        raise ConfigError(
            f"{path} ({what}) is empty; delete it and run `prefect-swarm up -c {paths.config}` again."
        ) from None
    with os.fdopen(fd, "w") as fh:
        fh.write(make(32) + "\n")  # 256 random bits
    return _read_secret(path, what) or ""


def with_key(cfg: SwarmConfig, paths: SwarmPaths, *, create: bool = False) -> SwarmConfig:
    """``cfg`` with ``api_key`` set to the swarm's generated key when it has one (``create``: make it).

    An explicit ``api_key`` or ``backend.open_endpoint`` leaves ``cfg`` as it is.
    """
    if not generated(cfg):
        return cfg
    key = ensure_key(paths) if create else read_key(paths)
    return cfg.model_copy(update={"api_key": SecretStr(key)}) if key else cfg
