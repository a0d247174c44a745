"""Swarm: a config brought to life — plan, backends, state — as a context manager.

with Swarm(cfg) as swarm:            # up -> wait_ready
    run_things(swarm.endpoint)
# down on every exit path, unless delete_on_exit=False

swarm = Swarm.from_state("qwen")     # any later process reattaches by name
swarm.status(); swarm.down()
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from prefect_swarm.backends import BackendPair, build_backends
from prefect_swarm.config import LeptonConfig, SwarmConfig
from prefect_swarm.exceptions import ConfigError, StateError
from prefect_swarm.interfaces import (
    ComputeBackend,
    ServingHandle,
    ServingPhase,
    ServingStatus,
    check_config,
)
from prefect_swarm.interfaces.jobenv import API_KEY
from prefect_swarm.paths import SwarmPaths, atomic_write_text
from prefect_swarm.state import StateStore, SwarmRecord

LIVE_PHASES = frozenset({ServingPhase.PENDING, ServingPhase.INITIALIZING, ServingPhase.RUNNING})


def engine_fingerprint(cfg: SwarmConfig) -> str:
    """What makes two swarms interchangeable: model, served name, engine and backend (not the name)."""
    import hashlib
    import json

    data = cfg.redacted()
    keep = {k: data[k] for k in ("model", "served_model_name", "gpus_per_replica", "engine", "backend")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def missing_secrets(config: dict[str, Any]) -> list[str]:
    """Secrets a recorded (redacted) config lacks that the environment does not supply either."""
    missing = []
    if config.get("api_key") is None and not os.environ.get(API_KEY):
        missing.append("api_key")
    backend = config.get("backend") or {}
    if "token" in backend and backend["token"] is None and not os.environ.get(str(backend.get("token_env") or "")):
        missing.append("backend.token")
    return missing


def restore_secrets(config: dict[str, Any], source: SwarmConfig | None = None) -> dict[str, Any]:
    """``config`` (redacted) with its secrets back: the environment's first, else ``source``'s.

    The backend token is taken from ``source`` only for the same backend type and workspace, and
    only when ``token_env`` is unset (an environment token is read by the backend itself).
    """
    data = dict(config)
    missing = missing_secrets(config)
    if os.environ.get(API_KEY):
        data["api_key"] = os.environ[API_KEY]
    elif "api_key" in missing and source is not None and source.api_key is not None:
        data["api_key"] = source.api_key
    lepton = source.backend if source is not None and isinstance(source.backend, LeptonConfig) else None
    backend = dict(data.get("backend") or {})
    same = lepton is not None and (lepton.type, lepton.workspace_id) == (
        backend.get("type"),
        backend.get("workspace_id"),
    )
    if "backend.token" in missing and lepton is not None and lepton.token is not None and same:
        data["backend"] = {**backend, "token": lepton.token}
    return data


class Swarm:
    """One swarm: its config, its backends, its state record."""

    def __init__(
        self,
        cfg: SwarmConfig,
        *,
        delete_on_exit: bool = True,
        store: StateStore | None = None,
        flow_run_id: str | None = None,
        keep: bool = False,
        handle: ServingHandle | None = None,
        source: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.source = source
        self.delete_on_exit = delete_on_exit
        self.store = store or StateStore()
        self.flow_run_id = flow_run_id
        self.keep = keep
        self.paths = SwarmPaths.for_swarm(cfg.name)
        self.backends: BackendPair = build_backends(cfg, self.paths)
        self.handle = handle

    # ------------------------------------------------------------------ lifecycle
    def validate(self) -> None:
        """Refuse what the backend cannot do (its capabilities, its own pre-flight); starts nothing."""
        check_config(self.cfg, self.backends.serving.capabilities())
        self.backends.serving.validate(self.cfg)

    def up(self) -> ServingHandle:
        """Validate, record, and start (or reconcile) the swarm. Returns once submitted."""
        self.validate()
        existing = self.store.get_swarm(self.cfg.name)
        if existing and existing.phase in LIVE_PHASES and existing.backend != self.cfg.backend.type:
            raise ConfigError(
                f"swarm '{self.cfg.name}' already runs on the {existing.backend} backend. "
                f"`prefect-swarm down {self.cfg.name}` first, or pick another name."
            )
        self.paths.ensure()
        import yaml

        atomic_write_text(self.paths.config, yaml.safe_dump(self.cfg.redacted(), sort_keys=False))
        self._record(ServingPhase.PENDING, handle=None if not existing else existing.handle)
        self.handle = self.backends.serving.create_or_update(self.cfg)
        self._record(ServingPhase.INITIALIZING, handle=self.handle.to_dict())
        return self.handle

    def wait_ready(self, timeout_s: float | None = None) -> ServingStatus:
        """Block until every replica answers; record RUNNING, or FAILED with the error."""
        handle = self._require_handle()
        try:
            status = self.backends.serving.wait_ready(handle, timeout_s or self.cfg.ready_timeout_s)
        except BaseException:
            self._set_phase(ServingPhase.FAILED)
            raise
        self._learn_url(status)
        self._set_phase(ServingPhase.RUNNING)
        return status

    def status(self) -> ServingStatus:
        """The swarm now (never blocks on it)."""
        return self.backends.serving.status(self._require_handle())

    def down(self) -> None:
        """Stop everything; idempotent. The record stays, phase STOPPED, for history."""
        if self.handle is None:
            rec = self.store.get_swarm(self.cfg.name)
            if rec and rec.handle:
                self.handle = ServingHandle.from_dict(rec.handle)
        if self.handle is None:
            # create_or_update may have failed halfway: let the backend find what it started.
            self.handle = ServingHandle(name=self.cfg.name, backend=self.cfg.backend.type)
        self.backends.serving.delete(self.handle)
        if self.store.get_swarm(self.cfg.name) is not None:
            self._set_phase(ServingPhase.STOPPED)

    def __enter__(self) -> Swarm:
        try:
            self.up()
            self.wait_ready()
        except BaseException:
            if self.delete_on_exit:
                self.down()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.delete_on_exit:
            self.down()

    # ------------------------------------------------------------------ access
    @property
    def endpoint(self) -> str:
        """Base URL clients call (``.../v1/chat/completions`` below it)."""
        handle = self._require_handle()
        if not handle.url:  # not learnt yet (up without wait_ready): ask the backend once, never blocking
            handle = self._learn_url(self.backends.serving.status(handle))
        if not handle.url:
            raise StateError(f"swarm '{self.cfg.name}' has no endpoint URL yet; is it up?")
        return handle.url

    @property
    def endpoints(self) -> list[str]:
        """Every URL requests may be spread over (replicas directly where the backend allows)."""
        handle = self._require_handle()
        urls = handle.meta.get("replica_urls") or []
        return list(urls) or [self.endpoint]

    @property
    def compute(self) -> ComputeBackend:
        """Compute backend running jobs against this swarm."""
        return self.backends.compute(self.handle)

    @property
    def fingerprint(self) -> str:
        """See :func:`engine_fingerprint`."""
        return engine_fingerprint(self.cfg)

    @classmethod
    def from_state(
        cls, name: str, store: StateStore | None = None, *, secrets: SwarmConfig | None = None, **kwargs: Any
    ) -> Swarm:
        """Reattach to swarm ``name`` from the state database.

        The record holds no secrets: they come from the environment (``PREFECT_SWARM_API_KEY``,
        the backend's ``token_env``), else from ``secrets``, the config the swarm came from
        (the Prefect layer reloads it from the block named by the record's ``source``).
        """
        store = store or StateStore()
        rec = store.require_swarm(name)
        cfg = SwarmConfig.model_validate(restore_secrets(rec.config, secrets))
        handle = ServingHandle.from_dict(rec.handle) if rec.handle else None
        kwargs.setdefault("flow_run_id", rec.flow_run_id)
        kwargs.setdefault("keep", rec.keep)
        kwargs.setdefault("source", rec.source)
        return cls(cfg, store=store, handle=handle, **kwargs)

    # ------------------------------------------------------------------ internals
    def _require_handle(self) -> ServingHandle:
        if self.handle is None:
            raise StateError(f"swarm '{self.cfg.name}' has not been brought up (no handle).")
        return self.handle

    def _learn_url(self, status: ServingStatus) -> ServingHandle:
        """Keep (and record) the URL ``status`` reports: some backends learn it only once running
        (Slurm: the LB's node)."""
        handle = self._require_handle()
        if status.url and status.url != handle.url:
            self.handle = handle = dataclasses.replace(handle, url=status.url)
            self.store.update_swarm(self.cfg.name, handle=handle.to_dict())
        return handle

    def _record(self, phase: ServingPhase, handle: dict[str, Any] | None) -> None:
        old = self.store.get_swarm(self.cfg.name)
        self.store.put_swarm(
            SwarmRecord(
                name=self.cfg.name,
                backend=self.cfg.backend.type,
                config=self.cfg.redacted(),
                phase=phase,
                handle=handle,
                flow_run_id=self.flow_run_id,
                keep=self.keep,
                fingerprint=self.fingerprint,
                source=self.source,
                created_at=old.created_at if old and old.phase in LIVE_PHASES else time.time(),
            )
        )

    def _set_phase(self, phase: ServingPhase) -> None:
        self.store.update_swarm(self.cfg.name, phase=phase)
