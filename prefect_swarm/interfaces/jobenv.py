"""The environment contract between the control plane and the processes it starts.

Every ``PREFECT_SWARM_*`` variable that crosses a process boundary is named here once
(:data:`PROTOCOL`), and read here only (:func:`env_value`): these are names the control plane
writes for the processes it starts, not knobs. The knobs a user sets are
:class:`prefect_swarm.settings.Settings` (``PREFECT_SWARM_HOME`` and ``PREFECT_SWARM_LOG_LEVEL`` are
both: a user sets them, and the control plane hands them on).

- :class:`JobEnv` is what a job process (``python -m prefect_swarm.jobs.run``) or a user's script
  reads: where to send requests, which model, the API key, which shard it is. The submitter writes
  it with :meth:`JobEnv.to_env` / :meth:`JobEnv.secret_env`; the job process reads it with
  :meth:`JobEnv.from_env`.
- :class:`JobRuntime` is how a compute backend starts a job process: the interpreter that exists
  *where the job runs* (a Lepton container, a Slurm node), its base environment and working
  directory. The control plane asks the backend for it instead of using its own ``sys.executable``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

ENDPOINTS = "PREFECT_SWARM_ENDPOINTS"
"""Comma-separated base URLs a job spreads its requests over."""
ENDPOINT = "ENDPOINT"
"""One base URL (the swarm's endpoint), for users' scripts."""
MODEL = "MODEL"
"""The served model name."""
API_KEY = "PREFECT_SWARM_API_KEY"
"""The swarm's API key: engines require it, clients send it, a reattaching process reads it."""
BEARER_TOKEN = re.compile(r"^[A-Za-z0-9._~+/-]+=*$")
"""RFC 6750's b64token: what an ``Authorization: Bearer`` value, so an API key, may hold (and all
the Slurm LB's check takes)."""
SHARD_ID = "PREFECT_SWARM_SHARD_ID"
NSHARDS = "PREFECT_SWARM_NSHARDS"
HOME = "PREFECT_SWARM_HOME"
"""Where state and job folders live (``~/.prefect-swarm`` by default)."""
LOG_LEVEL = "PREFECT_SWARM_LOG_LEVEL"
USER_UMASK = "PREFECT_SWARM_USER_UMASK"
OWNER = "PREFECT_SWARM_OWNER"

PROTOCOL: dict[str, str] = {
    ENDPOINTS: "Comma-separated base URLs a job process spreads its requests over (`ENDPOINT`: the first).",
    API_KEY: "The swarm's API key (as `PREFECT_SWARM_<FIELD>`, the config's `api_key`): engines require it, "
    "clients send it, a process that reattaches to the swarm reads it. Secret: passed through a process environment "
    "only.",
    SHARD_ID: "Which shard a job process runs (0-based).",
    NSHARDS: "How many shards the job has.",
    HOME: "The home folder of the process that started this one (the setting of the same name).",
    LOG_LEVEL: "The job process's log level (the setting of the same name).",
    USER_UMASK: "The umask the user started prefect-swarm with (octal): a job's committed output is made with it "
    "(prefect-swarm's own processes run with 077).",
    OWNER: "On Lepton, the identity of the swarm that made an endpoint, in the endpoint's spec (read back from the "
    "spec, not from a process environment).",
}
"""Every ``PREFECT_SWARM_*`` name a process of ours writes for the processes it starts -> what it carries."""

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_REQUEUE = 0, 1, 2, 75
"""A job process's exit codes: done; failed; refused its input (fix it); stopped by a signal
(SIGTERM/SIGUSR1: a preemption, a time limit, a cancel), by an outage of the swarm past its
``outage_timeout_s`` or at the swarm's budget, after flushing its checkpoint, so a rerun resumes it
(75 is EX_TEMPFAIL)."""


@dataclass(frozen=True)
class JobEnv:
    """What a job process learns from its environment (anything the spec does not say)."""

    endpoints: tuple[str, ...] = ()
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    shard_id: int | None = None
    nshards: int | None = None
    home: str | None = None
    log_level: str | None = None

    def to_env(self) -> dict[str, str]:
        """The plain (non-secret) variables; the API key goes by :meth:`secret_env` only."""
        env: dict[str, str] = {}
        if self.endpoints:
            env[ENDPOINTS] = ",".join(self.endpoints)
            env[ENDPOINT] = self.endpoints[0]
        for name, value in (
            (MODEL, self.model),
            (SHARD_ID, self.shard_id),
            (NSHARDS, self.nshards),
            (HOME, self.home),
            (LOG_LEVEL, self.log_level),
        ):
            if value is not None and value != "":
                env[name] = str(value)
        return env

    def secret_env(self) -> dict[str, str]:
        """The secret variables (passed as a compute backend's ``secret_env``, never rendered)."""
        return {API_KEY: self.api_key} if self.api_key else {}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> JobEnv:
        """Read the contract back (``os.environ`` by default); unset or empty values are None."""
        env = os.environ if environ is None else environ
        raw = env_value(ENDPOINTS, env) or env.get(ENDPOINT) or ""
        return cls(
            endpoints=tuple(u.strip().rstrip("/") for u in raw.split(",") if u.strip()),
            model=env.get(MODEL) or None,
            api_key=env_value(API_KEY, env),
            shard_id=_int(env_value(SHARD_ID, env)),
            nshards=_int(env_value(NSHARDS, env)),
            home=env_value(HOME, env),
            log_level=env_value(LOG_LEVEL, env),
        )


def env_value(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of protocol variable ``name`` (a key of :data:`PROTOCOL`) in ``environ``
    (``os.environ`` by default); None when unset or empty. The one place such a variable is read."""
    if name not in PROTOCOL:
        raise ValueError(f"{name} is not a process-protocol variable ({', '.join(PROTOCOL)}); a knob is a setting")
    return (os.environ if environ is None else environ).get(name) or None


def _int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


@dataclass(frozen=True)
class JobRuntime:
    """How a compute backend starts a job process where the job runs."""

    python: str
    """The interpreter in the job's environment (``python3`` in a container image, the Slurm
    config's ``job_python``, this interpreter for local jobs)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Base environment every job process gets (the swarm's ``env``, ``PREFECT_SWARM_HOME``)."""
    workdir: str | None = None
    """Working directory of the job process; None leaves the backend's default."""
    image: str | None = None
    """Container image the job runs in; None runs on the host."""

    def module_argv(self, module: str, *args: str) -> list[str]:
        """``[python, -m, module, *args]`` with this runtime's interpreter."""
        return [self.python, "-m", module, *args]


__all__ = [
    "API_KEY",
    "ENDPOINT",
    "ENDPOINTS",
    "HOME",
    "LOG_LEVEL",
    "MODEL",
    "NSHARDS",
    "SHARD_ID",
    "JobEnv",
    "JobRuntime",
]
