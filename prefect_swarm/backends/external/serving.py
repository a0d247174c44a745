"""External serving: an OpenAI-compatible endpoint prefect-swarm did not start and never stops.

A vLLM server someone runs, an inference gateway, a hosted provider. There is no lifecycle:
``create_or_update`` records the endpoint (a handle with its base URL), ``wait_ready`` asks one real
chat completion of it, ``status`` looks at ``/v1/models``, ``delete`` forgets it (it removes only
this swarm's own files: the key ``up`` kept) and never sends anything to the server. Jobs run on
this machine (:class:`~prefect_swarm.backends.external.compute.ExternalCompute`).

The key: the swarm's ``api_key`` (a SwarmSpec block's, or one the Prefect layer loaded from the
Secret block named by ``backend.api_key_secret``), else the environment variable named by
``backend.api_key_env``, read when it is needed. It reaches requests and job processes through
the environment only: never a state row, a plan, a job spec or a log.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from prefect_swarm.backends.sleep import SleepRefused
from prefect_swarm.config import ExternalConfig
from prefect_swarm.exceptions import ConfigError, ReadinessError
from prefect_swarm.interfaces import Capabilities, Capability, ServingHandle
from prefect_swarm.interfaces.metrics import MetricsTargets
from prefect_swarm.interfaces.readiness import check_answer, http_client
from prefect_swarm.interfaces.types import ReplicaHealth, ReplicaStatus, ServingPhase, ServingStatus
from prefect_swarm.interfaces.usage import GpuUsage

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig
    from prefect_swarm.paths import SwarmPaths

NOT_MANAGED = "external endpoint (not started or stopped by prefect-swarm)"

READY_POLL_S = 2.0
"""Seconds between two readiness completions while the endpoint does not answer yet."""

HOPELESS = frozenset({400, 401, 403, 404, 422})
"""Answers to the readiness completion that waiting will not change (a wrong key, model or URL)."""


def external(cfg: SwarmConfig) -> ExternalConfig:
    """The external backend section of ``cfg``."""
    if not isinstance(cfg.backend, ExternalConfig):
        raise ConfigError(f"ExternalServing needs backend.type 'external', not '{cfg.backend.type}'.")
    return cfg.backend


def external_key(cfg: SwarmConfig) -> str | None:
    """The key clients of this endpoint send: ``api_key``, else ``$<backend.api_key_env>``; None for an open one."""
    if cfg.api_key is not None:
        return cfg.api_key.get_secret_value()
    name = external(cfg).api_key_env
    return (os.environ.get(name) or None) if name else None


class ExternalServing(SleepRefused):
    """ServingBackend for an endpoint someone else runs (see the module doc)."""

    backend = "external"

    def __init__(self, cfg: SwarmConfig, paths: SwarmPaths) -> None:
        self.cfg = cfg
        self.paths = paths

    @property
    def ext(self) -> ExternalConfig:
        """The external backend section of the config."""
        return external(self.cfg)

    def capabilities(self) -> Capabilities:
        """Detached jobs (they run on this machine) and nothing else: the endpoint is not ours to shape."""
        theirs = "the endpoint is run by someone else; prefect-swarm only sends it requests"
        return Capabilities.all_but(
            "external",
            {
                Capability.LOAD_BALANCER: theirs,
                Capability.WATCHDOG: theirs,
                Capability.PREEMPTION_SIGNAL: theirs,
                Capability.GPU_REQUEST: theirs,
                Capability.MULTI_NODE: theirs,
                Capability.SHARED_STORAGE: "jobs run on this machine",
                Capability.CONTAINERS: theirs,
                Capability.WALL_TIME: theirs,
                Capability.EXEC: theirs,
                Capability.PARK: "the endpoint's GPUs are not prefect-swarm's to give back or take again",
                Capability.SLEEP_WAKE: theirs,
            },
            max_replicas=1,
        )

    def validate(self, cfg: SwarmConfig, *, ask: bool = True) -> list[str]:
        """The key's source is set up (warnings only: `validate` needs no credentials)."""
        ext, warnings = external(cfg), []
        if ext.api_key_env and not os.environ.get(ext.api_key_env) and cfg.api_key is None:
            warnings.append(f"backend.api_key_env: ${ext.api_key_env} is not set here; `up` and jobs need it")
        if ext.api_key_secret and cfg.api_key is None:
            warnings.append(
                f"backend.api_key_secret: the Secret block '{ext.api_key_secret}' is loaded by `up` (Prefect API)"
            )
        return warnings

    def plan(self) -> dict[str, str]:
        """What ``up`` records: the endpoint, the model, the limits and where the key comes from (never the key)."""
        ext = self.ext
        source = (
            f"env {ext.api_key_env}"
            if ext.api_key_env
            else f"Secret block {ext.api_key_secret}"
            if ext.api_key_secret
            else "api_key"
            if self.cfg.api_key is not None
            else "none (open endpoint)"
        )
        doc = {
            "url": ext.base_url,
            "model": self.cfg.model_name,
            "api_key": source,
            "max_concurrency": ext.max_concurrency,
            "requests_per_minute": ext.requests_per_minute,
            "tokens_per_minute": ext.tokens_per_minute,
            "lifecycle": "none: up records the endpoint after one completion, down forgets it",
        }
        return {"external.json": json.dumps(doc, indent=2) + "\n"}

    def _key(self) -> str | None:
        ext = self.ext
        key = external_key(self.cfg)
        if key is None and ext.api_key_env:
            raise ConfigError(
                f"backend.api_key_env: ${ext.api_key_env} is not set, so there is no key for {ext.base_url}. "
                f"Export {ext.api_key_env} (or name another variable) and run the command again."
            )
        if key is None and ext.api_key_secret:
            raise ConfigError(
                f"backend.api_key_secret: the Secret block '{ext.api_key_secret}' was not loaded (this command "
                "cannot reach the Prefect API, or the block is empty). Check `prefect block ls`, or use "
                "backend.api_key_env instead."
            )
        return key

    def create_or_update(self, cfg: SwarmConfig) -> ServingHandle:
        """Record the endpoint; starts nothing. The key must be at hand (its source named when it is not)."""
        self.cfg = cfg
        self._key()
        url = self.ext.base_url
        return ServingHandle(
            name=cfg.name, backend=self.backend, url=url, meta={"replica_urls": [url], "managed": False}
        )

    def wait_ready(self, handle: ServingHandle, timeout_s: float) -> ServingStatus:
        """One real chat completion answers. A wrong key, model or URL (400/401/403/404/422) fails at once."""
        deadline = time.monotonic() + timeout_s
        key, url = self._key(), handle.url or self.ext.base_url
        while True:
            left = deadline - time.monotonic()
            wait_s = max(1.0, min(self.ext.request_timeout_s, left))
            probe = check_answer(url, self.cfg.model_name, key, timeout_s=wait_s)
            if probe.ok:
                return self._status(handle, ReplicaHealth.HEALTHY, "ready: answered a request of the model")
            code = probe.detail.split(":", 1)[0].removeprefix("HTTP ")
            if code.isdigit() and int(code) in HOPELESS:
                raise ReadinessError(
                    f"swarm '{self.cfg.name}': {url} refused the readiness completion for model "
                    f"'{self.cfg.model_name}': {probe.detail}",
                    hint="check backend.url, model/served_model_name (the name the endpoint serves) and the key "
                    "(backend.api_key_env or backend.api_key_secret).",
                )
            if time.monotonic() + READY_POLL_S > deadline:
                raise ReadinessError(
                    f"swarm '{self.cfg.name}': {url} did not answer a chat completion within {timeout_s:g}s: "
                    f"{probe.detail}",
                    hint="check that the endpoint is up and reachable from this machine; raise ready_timeout_s "
                    "if it is slow to answer.",
                )
            time.sleep(READY_POLL_S)

    def status(self, handle: ServingHandle) -> ServingStatus:
        """One GET of ``/v1/models`` (short timeout): RUNNING when it answers 200, else UNKNOWN with why."""
        url = handle.url or self.ext.base_url
        key = external_key(self.cfg)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            resp = http_client().get(url + "/v1/models", headers=headers, timeout=min(5.0, self.ext.request_timeout_s))
        except httpx.HTTPError as exc:
            return self._status(
                handle, ReplicaHealth.UNKNOWN, f"unreachable: {type(exc).__name__}", ServingPhase.UNKNOWN
            )
        if resp.status_code != 200:
            return self._status(
                handle, ReplicaHealth.UNKNOWN, f"/v1/models: HTTP {resp.status_code}", ServingPhase.UNKNOWN
            )
        return self._status(handle, ReplicaHealth.HEALTHY, "answering")

    def _status(
        self, handle: ServingHandle, health: ReplicaHealth, detail: str, phase: ServingPhase = ServingPhase.RUNNING
    ) -> ServingStatus:
        url = handle.url or self.ext.base_url
        rep = ReplicaStatus(index=0, health=health, url=url, detail=detail)
        return ServingStatus(phase=phase, url=url, detail=f"{NOT_MANAGED}: {detail}", replicas=(rep,))

    def delete(self, handle: ServingHandle) -> None:
        """Forget the endpoint: remove the key ``up`` kept for this swarm. Nothing is sent to the server."""
        self.paths.api_key_file.unlink(missing_ok=True)

    def client_key(self) -> str | None:
        """See :meth:`ServingBackend.client_key`."""
        return external_key(self.cfg)

    def key_sources(self) -> list[str]:
        """See :meth:`ServingBackend.key_sources`: the variable named by ``backend.api_key_env``, or the
        Secret block named by ``backend.api_key_secret`` (which `up` loads into the swarm's key)."""
        ext = self.ext
        if ext.api_key_env:
            state = "set" if os.environ.get(ext.api_key_env) else "not set here"
            return [f"${ext.api_key_env}, named by backend.api_key_env ({state})"]
        if ext.api_key_secret:
            return [f"the Secret block '{ext.api_key_secret}', named by backend.api_key_secret (loaded by `up`)"]
        return []

    def metrics_targets(self, handle: ServingHandle) -> MetricsTargets:
        """None: the endpoint's engine metrics (if any) are not ours to scrape."""
        return MetricsTargets(reason=NOT_MANAGED)

    def gpu_usage(self, handle: ServingHandle) -> GpuUsage:
        """No GPU-hours: no GPUs of ours (a priced provider's cost is its tokens, in each job's cost)."""
        why = "an external endpoint holds no GPUs of ours; a priced provider's cost is its tokens, in each job's cost"
        return GpuUsage(None, "n/a", gpus=0, reason=why)

    def exec_command(self, handle: ServingHandle, replica: int, argv: Sequence[str]) -> int:
        """Refused: there is no replica of ours to run a command in."""
        self.capabilities().require(Capability.EXEC, "`prefect-swarm exec`")
        return 1  # pragma: no cover - require raised

    def replica_log(self, handle: ServingHandle, replica: int, *, follow: bool = False) -> Iterator[str]:
        """Refused: the endpoint's server keeps its own logs; prefect-swarm has none of it."""
        del handle, replica, follow
        raise ConfigError(
            "an external endpoint has no replica logs prefect-swarm can read: they are the server's own; "
            "ask whoever runs it."
        )

    def park(self, handle: ServingHandle) -> dict[str, Any]:
        """Refused: the endpoint's GPUs are someone else's (ConfigError with the reason); stops nothing."""
        self.capabilities().require(Capability.PARK, f"`prefect-swarm park {handle.name}`")
        return {}  # pragma: no cover - require raised

    def restore(self, cfg: SwarmConfig, parked: dict[str, Any]) -> ServingHandle:
        """Refused, as :meth:`park`."""
        self.capabilities().require(Capability.PARK, f"`prefect-swarm restore {cfg.name}`")
        raise AssertionError("unreachable")  # pragma: no cover - require raised
