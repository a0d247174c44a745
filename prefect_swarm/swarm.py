"""Swarm: a config brought to life — plan, backends, state — as a context manager.

with Swarm(cfg) as swarm:            # up -> wait_ready
    run_things(swarm.endpoint)
# down on every exit path, unless delete_on_exit=False

swarm = Swarm.from_state("qwen")     # any later process reattaches by name
swarm.status(); swarm.down()

Sharing a swarm (its leases, who is still there, join and release) is
:class:`~prefect_swarm.holding.Holding`'s; ``down()`` stops the swarm whatever holds it
(``down --force``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from pydantic import SecretStr

from prefect_swarm.backends import BackendPair, build_backends
from prefect_swarm.backends.registry import ENTRIES
from prefect_swarm.backends.sleep import asleep
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError, ReadinessError, StateError
from prefect_swarm.interfaces import (
    Capability,
    ComputeBackend,
    ServingHandle,
    ServingPhase,
    ServingStatus,
    SleepReport,
    check_config,
)
from prefect_swarm.interfaces.jobenv import API_KEY, env_value
from prefect_swarm.interfaces.parking import Snapshot
from prefect_swarm.paths import SwarmPaths, atomic_write_text, read_secret, write_secret
from prefect_swarm.state import LeaseKind, StateStore, SwarmRecord, process_lease, this_host

log = logging.getLogger("prefect_swarm.swarm")

LIVE_PHASES = frozenset({ServingPhase.PENDING, ServingPhase.INITIALIZING, ServingPhase.RUNNING})
"""Phases of a swarm that holds (or is getting) its GPUs. PARKED is not live: the next holder's
claim brings it back (a restore, from its snapshot), exactly once however many arrive."""

ENGINE_CACHE_ENV = ("HF_HOME", "HF_HUB_CACHE", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
"""The engine's download and compile caches a parked swarm's snapshot names (where ``engine.env`` sets them)."""


def engine_fingerprint(cfg: SwarmConfig) -> str:
    """What makes two swarms interchangeable: model, served name, engine and backend (not the name, nor
    the backend's price, budget or client-side limits: a larger budget resumes the same checkpoints)."""
    import hashlib
    import json

    from prefect_swarm.config.backends import CLIENT_SIDE_FIELDS

    data = cfg.redacted()
    data["backend"] = {k: v for k, v in data["backend"].items() if k not in CLIENT_SIDE_FIELDS}
    data["engine"] = {k: v for k, v in data["engine"].items() if k != "capacity"}  # a client-side sizing hint
    keep = {k: data[k] for k in ("model", "served_model_name", "gpus_per_replica", "engine", "backend")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def missing_secrets(config: dict[str, Any]) -> list[str]:
    """Secrets a recorded (redacted) config lacks that the environment does not supply either."""
    missing = []
    if config.get("api_key") is None and not env_value(API_KEY):
        missing.append("api_key")
    backend = config.get("backend") or {}
    entry = ENTRIES.get(backend.get("type", "local"))
    for name in entry.secret_fields if entry else ():
        if name in backend and backend[name] is None and not os.environ.get(str(backend.get(f"{name}_env") or "")):
            missing.append(f"backend.{name}")
    return missing


def restore_secrets(config: dict[str, Any], source: SwarmConfig | None = None) -> dict[str, Any]:
    """``config`` (redacted) with its secrets back: the environment's first, else ``source``'s.

    A backend secret (the Lepton token: its entry's ``secret_fields``) is taken from ``source`` only for
    the same backend type and scope (its entry's ``secret_scope``: the workspace), and only when its
    variable is unset (an environment token is read by the backend itself).
    """
    data = dict(config)
    missing = missing_secrets(config)
    if env_value(API_KEY):
        data["api_key"] = env_value(API_KEY)
    elif "api_key" in missing and source is not None and source.api_key is not None:
        data["api_key"] = source.api_key
    backend = dict(data.get("backend") or {})
    recorded = source.backend if source is not None and source.backend.type == backend.get("type") else None
    if recorded is None:
        return data
    entry = ENTRIES[recorded.type]
    if any(getattr(recorded, name) != backend.get(name) for name in entry.secret_scope):
        return data
    for name in entry.secret_fields:
        value = getattr(recorded, name)
        if f"backend.{name}" in missing and value is not None:
            data["backend"] = backend = {**backend, name: value}
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
        self.paths = SwarmPaths.of(cfg.name, cfg.run_dir)
        self.backends: BackendPair = build_backends(cfg, self.paths)
        self.handle = handle

    # ------------------------------------------------------------------ lifecycle
    def validate(self, *, ask: bool = True) -> list[str]:
        """Refuse what the backend cannot do (its capabilities, its own pre-flight, with ``ask`` the
        scheduler's answer where it can be asked); starts nothing. Returns what could not be checked."""
        check_config(self.cfg, self.backends.serving.capabilities())
        return self.backends.serving.validate(self.cfg, ask=ask)

    def up(self) -> ServingHandle:
        """Validate, record, and start (or reconcile) the swarm. Returns once submitted."""
        self.validate()
        parked = self._restorable()  # before the kept config is rewritten: it judges an idle park's snapshot
        existing = self.store.get_swarm(self.cfg.name)
        if existing and existing.phase in LIVE_PHASES and existing.backend != self.cfg.backend.type:
            raise ConfigError(
                f"swarm '{self.cfg.name}' already runs on the {existing.backend} backend. "
                f"`prefect-swarm down {self.cfg.name}` first, or pick another name."
            )
        self.paths.ensure()
        import yaml

        atomic_write_text(self.paths.config, yaml.safe_dump(self.cfg.redacted(), sort_keys=False))
        if self.cfg.api_key is not None:  # later commands and jobs of this user find it there (from_state)
            write_secret(self.paths.api_key_file, self.cfg.api_key.get_secret_value())
        bringer = process_lease(LeaseKind.BRING_UP, f"bring-up:{this_host()}:{os.getpid()}")
        self.store.put_lease(dataclasses.replace(bringer, swarm=self.cfg.name))
        try:
            self._record(ServingPhase.PENDING, handle=None if not existing else existing.handle)
            if parked is not None:
                log.info("restoring swarm '%s' from its snapshot (parked: %s)", self.cfg.name, parked.reason)
                self.handle = self.backends.serving.restore(self.cfg, parked.serving)
            else:
                self.paths.parked.unlink(missing_ok=True)  # another engine under this name: a cold start
                self.handle = self.backends.serving.create_or_update(self.cfg)
        except BaseException:
            # a failed bring-up leaves a FAILED record (blocking nobody: the next `up` brings it up
            # at once); a failed reconcile of a started swarm leaves it in the phase it was in
            started = existing is not None and existing.handle is not None and existing.phase in LIVE_PHASES
            self._set_phase(existing.phase if existing is not None and started else ServingPhase.FAILED)
            raise
        finally:
            self.store.release_lease(self.cfg.name, bringer.owner)
        self._record(ServingPhase.INITIALIZING, handle=self.handle.to_dict())
        return self.handle

    def wait_ready(self, timeout_s: float | None = None) -> ServingStatus:
        """Block until every replica answers; record RUNNING, or FAILED with the error. A swarm with
        replicas asleep is refused at once (ReadinessError: they would never answer), its phase kept."""
        handle = self._require_handle()
        sleeping = sorted(asleep(self.paths))
        if sleeping:
            raise ReadinessError(
                f"swarm '{self.cfg.name}' has replica(s) {', '.join(map(str, sleeping))} asleep: they answer "
                "nothing until woken.",
                hint=f"`prefect-swarm wake {self.cfg.name}` wakes them (seconds), then run again.",
            )
        try:
            status = self.backends.serving.wait_ready(handle, timeout_s or self.cfg.ready_timeout_s)
        except BaseException:
            self._set_phase(ServingPhase.FAILED)
            raise
        self._learn_url(status)
        self.paths.parked.unlink(missing_ok=True)  # restored (before RUNNING: see Holding.settle_parked)
        self._set_phase(ServingPhase.RUNNING)
        return status

    def status(self) -> ServingStatus:
        """The swarm now (never blocks on it); PARKED while its snapshot is kept and nothing of it runs."""
        status = self.backends.serving.status(self._require_handle())
        parked = Snapshot.read(self.paths) if status.phase is ServingPhase.STOPPED else None
        if parked is not None:
            return ServingStatus(ServingPhase.PARKED, None, f"parked: {parked.reason}; `prefect-swarm restore` it")
        return status

    # ------------------------------------------------------------------ park
    def park(self, reason: str) -> Snapshot:
        """Give back every GPU the swarm holds, keep the snapshot a fast restore needs, record PARKED.

        Its holders keep their leases (a job on it pauses until the restore). While the backend stops
        the replicas a TEARDOWN lease makes a concurrent claim wait. Idempotent: a parked swarm's
        snapshot is returned as it is. ConfigError when the backend cannot park (with its reason),
        StateError when the swarm is not live."""
        name = self.cfg.name
        self.backends.serving.capabilities().require(Capability.PARK, f"parking swarm '{name}'")
        rec = self.store.require_swarm(name)
        kept = Snapshot.read(self.paths)
        if rec.phase is ServingPhase.PARKED and kept is not None:
            return kept
        if rec.phase not in LIVE_PHASES or not rec.handle:
            raise StateError(
                f"swarm '{name}' is {rec.phase.value}, so there is nothing to park; "
                f"`prefect-swarm up` brings it up, `prefect-swarm status {name}` shows it."
            )
        self.handle = ServingHandle.from_dict(rec.handle)
        snap = self._snapshot(reason)
        stopper = process_lease(LeaseKind.TEARDOWN, f"park:{this_host()}:{os.getpid()}")
        stopper = dataclasses.replace(stopper, swarm=name)
        self.store.put_lease(stopper)
        try:
            snap.write(self.paths)  # first: a job that sees its endpoints go reads it as a pause, not an outage
            try:
                snap = dataclasses.replace(snap, serving=self.backends.serving.park(self.handle))
            except BaseException:
                self.paths.parked.unlink(missing_ok=True)
                raise
            snap.write(self.paths)
            self._set_phase(ServingPhase.PARKED)
        finally:
            self.store.release_lease(name, stopper.owner)
        return snap

    def _restorable(self) -> Snapshot | None:
        """The snapshot of this swarm when it is parked with this engine (its fingerprint, or for a snapshot
        that has none, the swarm's kept config's); None when it is not parked, or parked with another."""
        snap = Snapshot.read(self.paths)
        if snap is None:
            return None
        kept = snap.fingerprint
        if not kept:
            import yaml

            try:
                kept = engine_fingerprint(SwarmConfig.model_validate(yaml.safe_load(self.paths.config.read_text())))
            except Exception:  # unreadable or from another version: not restorable, a cold start
                return None
        return snap if kept == self.fingerprint else None

    def _snapshot(self, reason: str) -> Snapshot:
        """What a restore of this swarm needs (see :class:`Snapshot`); no secret."""
        env = {**self.cfg.env, **self.cfg.engine.env}
        return Snapshot(
            name=self.cfg.name,
            backend=self.cfg.backend.type,
            fingerprint=self.fingerprint,
            replicas=self.cfg.replicas,
            reason=reason,
            config_file=str(self.paths.config),
            key_file=str(self.paths.api_key_file) if self.paths.api_key_file.exists() else None,
            staged_model=self.cfg.staged_model,
            caches={k: env[k] for k in ENGINE_CACHE_ENV if env.get(k)},
        )

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
        self.paths.parked.unlink(missing_ok=True)  # a parked swarm taken down is no longer restorable
        if self.store.get_swarm(self.cfg.name) is not None:
            self._set_phase(ServingPhase.STOPPED)
        self.store.clear_leases(self.cfg.name)

    # --- sleep and wake (replicas that free their GPUs and keep their allocation) ---
    def sleep(self, replicas: Sequence[int] = (), level: int = 1) -> list[SleepReport]:
        """Put ``replicas`` (all when empty) to sleep: :meth:`ServingBackend.sleep`. The swarm stays up."""
        return self.backends.serving.sleep(self._require_handle(), replicas, level)

    def wake(self, replicas: Sequence[int] = ()) -> list[SleepReport]:
        """Wake ``replicas`` (all when empty): :meth:`ServingBackend.wake`."""
        return self.backends.serving.wake(self._require_handle(), replicas)

    def __enter__(self) -> Swarm:
        # The block holds the swarm while it runs (a PROCESS lease: gone with this process), so a job
        # submitted against it from elsewhere (`job submit`) does not stop it when that job lets go.
        self._block_lease = dataclasses.replace(
            process_lease(owner=f"with:{this_host()}:{os.getpid()}:{id(self):x}"), swarm=self.cfg.name
        )
        self.store.put_lease(self._block_lease)
        try:
            self.up()
            self.wait_ready()
        except BaseException:
            self.store.release_lease(self.cfg.name, self._block_lease.owner)
            if self.delete_on_exit:
                self.down()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.store.release_lease(self.cfg.name, self._block_lease.owner)
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
        """Every URL a job's requests may be spread over: the replicas themselves where a job process
        reaches them (:meth:`ComputeBackend.endpoints`), else :attr:`endpoint`."""
        self._require_handle()
        return self.compute.endpoints() or [self.endpoint]

    def check_key(self) -> None:
        """One request before a job's rows: ConfigError when the swarm refuses the key this process has
        for it (:meth:`ServingBackend.client_key`), or its absence. A swarm not reachable yet passes."""
        from prefect_swarm.interfaces.readiness import key_refused

        key = self.backends.serving.client_key()
        try:
            url = self.endpoint
        except StateError:
            return
        refused = key_refused(url, key)
        if refused:
            raise ConfigError(
                f"swarm '{self.cfg.name}' refused {'the API key' if key else 'a request without an API key'} "
                f"({refused} at {url}/v1/models); nothing was submitted. The key was looked for, in this order, "
                f"in: {'; '.join(self.key_sources())}. Put the swarm's key in the first of these that "
                "you use, or run `prefect-swarm up -c CONFIG` again as the user who owns the swarm."
            )

    def key_sources(self) -> list[str]:
        """Where this process looks for the key the swarm's clients send, in the order tried, each saying
        whether it is there (never the key): the environment, the config the swarm came from, the
        swarm's ``swarm.key``, then the backend's own (:meth:`ServingBackend.key_sources`)."""
        file = self.paths.api_key_file
        try:
            there = "there" if file.exists() else "not there"
        except OSError as exc:  # another user's folder
            there = f"cannot be read: {exc.strerror}"
        return [
            f"${API_KEY} ({'set' if env_value(API_KEY) else 'not set here'})",
            "the config's api_key (of the file or Prefect block the swarm came from)",
            f"{file} (kept 0600 by `up`; {there})",
            *self.backends.serving.key_sources(),
        ]

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
        (the Prefect layer reloads it from the block named by the record's ``source``); the API key
        last from the swarm's folder (``swarm.key``, 0600, kept by ``up``), so a plain shell of the
        user who brought the swarm up needs no environment variable.
        """
        store = store or StateStore()
        rec = store.require_swarm(name)
        cfg = SwarmConfig.model_validate(restore_secrets(rec.config, secrets))
        if cfg.api_key is None:  # the key `up` kept in the swarm's folder (0600, this user's only)
            key = read_secret(SwarmPaths.of(cfg.name, cfg.run_dir).api_key_file, "the swarm's API key")
            cfg = cfg.model_copy(update={"api_key": SecretStr(key)}) if key else cfg
        handle = ServingHandle.from_dict(rec.handle) if rec.handle else None
        kwargs.setdefault("flow_run_id", rec.flow_run_id)
        kwargs.setdefault("keep", rec.keep)
        kwargs.setdefault("source", rec.source)
        return cls(cfg, store=store, handle=handle, **kwargs)

    # ------------------------------------------------------------------ internals
    def as_recorded(self) -> Swarm:
        """This swarm object (its config as this holder has it: a run's budget, secrets) with the handle
        its record holds now: the swarm as a restore from a park brought it back (Slurm: new jobs)."""
        rec = self.store.require_swarm(self.cfg.name)
        again = copy.copy(self)
        again.handle = ServingHandle.from_dict(rec.handle) if rec.handle else None
        return again

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
        self.store.put_swarm(self.new_record(phase, handle))

    def new_record(self, phase: ServingPhase, handle: dict[str, Any] | None) -> SwarmRecord:
        """This swarm's record in ``phase`` with ``handle`` (what a claim or a bring-up writes)."""
        old = self.store.get_swarm(self.cfg.name)
        return SwarmRecord(
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

    def _set_phase(self, phase: ServingPhase) -> None:
        self.store.update_swarm(self.cfg.name, phase=phase)
