"""Swarm tasks: resolve the ``swarm`` parameter, bring up (or share), wait ready, release.

A flow run holds a lease on every swarm it uses (``flow-run:<id>``, see
:class:`~prefect_swarm.state.LeaseRecord`): the first run brings the swarm up, a concurrent one
waits for it and shares it. Teardown releases the run's leases; a swarm stops only when no live
lease is left. The flow's ``finally``, its hooks and the reaper all do it the same way
(:func:`teardown_flow_run`).
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_swarm import launch
from prefect_swarm.config import SwarmConfig, load_config
from prefect_swarm.config.swarm import Sharing
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces import ServingHandle
from prefect_swarm.state import LeaseRecord, StateStore, SwarmRecord
from prefect_swarm.swarm import (
    KEEP_OWNER,
    LIVE_PHASES,
    Swarm,
    engine_fingerprint,
    flow_run_lease,
    flow_run_owner,
    keep_lease,
    missing_secrets,
    process_lease,
)
from prefect_swarm.tasks._common import current_flow_run_id, retry_on_type, run_logger
from prefect_swarm.tasks.events import swarm_event

logger = logging.getLogger("prefect_swarm.tasks")

SWARM_SPEC_SLUG = "swarm-spec"
"""Block type slug of :class:`prefect_swarm.blocks.SwarmSpec` (kept here: blocks are imported lazily)."""

SwarmParam = str | dict[str, Any] | SwarmConfig
"""What a flow's ``swarm`` parameter may be: a SwarmSpec block (a SwarmConfig subclass) or its
name, a YAML path, or an inline config."""


def _as_block(swarm: SwarmParam) -> Any:
    from prefect_swarm.blocks import SwarmSpec

    return swarm if isinstance(swarm, SwarmSpec) else None


def resolve_swarm(swarm: SwarmParam) -> SwarmConfig:
    """Turn a ``swarm`` parameter into a SwarmConfig (secrets from the block or the environment)."""
    block = _as_block(swarm)
    if block is not None:
        return block.to_config()
    if isinstance(swarm, SwarmConfig):
        return swarm
    if isinstance(swarm, dict):
        return load_config(data=swarm)
    ref = block_ref(swarm)
    if ref is None:
        return load_config(Path(swarm).expanduser())
    return _load_block(ref)


def block_ref(swarm: SwarmParam) -> str | None:
    """The SwarmSpec block a ``swarm`` parameter names (``swarm-spec/NAME``); None for a file or inline config.

    Recorded with the swarm (never the secrets themselves), so teardown in another process can
    reload the block's secrets when its environment lacks them. A block object (picked in the UI)
    gives its saved name; an unsaved one, None.
    """
    block = _as_block(swarm)
    if block is not None:
        name = block._block_document_name
        return None if name is None or block._is_anonymous else f"{SWARM_SPEC_SLUG}/{name}"
    if not isinstance(swarm, str) or swarm.endswith((".yaml", ".yml")) or Path(swarm).expanduser().is_file():
        return None
    slug, _, doc = swarm.rpartition("/")
    return f"{slug or SWARM_SPEC_SLUG}/{doc}"


def _load_block(name: str) -> SwarmConfig:
    from prefect_swarm.blocks import SwarmSpec

    slug, _, doc = name.rpartition("/")
    if slug and slug != SwarmSpec.get_block_type_slug():
        raise ConfigError(f"swarm '{name}' names a '{slug}' block; a SwarmSpec block ('swarm-spec/NAME') is needed.")
    try:
        # _sync: hooks and the reaper may call this from a thread of an event loop
        block: SwarmSpec = SwarmSpec.load(doc, _sync=True)  # type: ignore[call-arg, assignment]
        return block.to_config()
    except ValueError as exc:
        raise ConfigError(
            f"swarm '{name}' is neither a YAML file nor a saved SwarmSpec block ({exc}). "
            "Hint: `prefect block ls` lists saved blocks; pass a path ending in .yaml for a config file."
        ) from None


def reattach(name: str, store: StateStore | None = None) -> Swarm:
    """:meth:`Swarm.from_state`, with the secrets the record dropped reloaded from the block the
    swarm came from when the environment lacks them.

    Teardown runs in processes that may not have the token in their environment (the flow run a
    worker started, the worker's cancel/crash hooks, the reaper): the SwarmSpec block named in
    the record (``source``) still holds it.
    """
    store = store or StateStore()
    rec = store.require_swarm(name)
    return Swarm.from_state(name, store=store, secrets=_source_secrets(rec))


def _source_secrets(rec: SwarmRecord) -> SwarmConfig | None:
    missing = missing_secrets(rec.config)
    if rec.source is None or not missing:
        return None
    try:
        return _load_block(rec.source)
    except Exception as exc:  # teardown goes on with what the environment has
        logger.warning(
            "swarm '%s': could not reload %s from block '%s' (%s: %s); using the environment's.",
            rec.name,
            " and ".join(missing),
            rec.source,
            type(exc).__name__,
            exc,
        )
        return None


def reusable_swarm(cfg: SwarmConfig, store: StateStore) -> SwarmRecord | None:
    """A live swarm serving the same engine on the same backend that nobody else's flow owns."""
    want = engine_fingerprint(cfg)
    for rec in store.list_swarms():
        if rec.phase not in LIVE_PHASES or rec.fingerprint != want or rec.backend != cfg.backend.type:
            continue
        if rec.keep or rec.flow_run_id is None:
            return rec
    return None


def attach(cfg: SwarmConfig, rec: SwarmRecord, store: StateStore) -> Swarm:
    """A Swarm object for an existing record, keeping ``cfg``'s secrets (the record has none)."""
    handle = ServingHandle.from_dict(rec.handle) if rec.handle else None
    cfg = cfg if cfg.name == rec.name else cfg.model_copy(update={"name": rec.name})
    return Swarm(cfg, store=store, handle=handle, flow_run_id=rec.flow_run_id, keep=rec.keep, source=rec.source)


def _current_lease() -> LeaseRecord:
    run_id = current_flow_run_id()
    return flow_run_lease(run_id) if run_id else process_lease()


def _adopt_unleased(rec: SwarmRecord, store: StateStore) -> None:
    """A live swarm with no lease at all was brought up before leases existed (or by hand):
    give it the KEEP lease its keep flag / lack of owner meant, so a sharer does not stop it."""
    if (rec.keep or rec.flow_run_id is None) and not store.list_leases(rec.name):
        store.put_lease(keep_lease(rec.name))


@task(
    name="swarm-up",
    task_run_name="swarm-up-{cfg.name}",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=retry_on_type,
)
def swarm_up(cfg: SwarmConfig, keep: bool = False, reuse: bool = True, source: str | None = None) -> Swarm:
    """Hold a lease on swarm ``cfg.name`` and bring it up, or share it when it is live or being
    brought up by another run (waiting for that, never starting it twice). With ``reuse``, a
    live kept swarm serving the same engine under another name is shared instead.

    ``source`` (see :func:`block_ref`) is recorded so teardown elsewhere can reload the secrets.
    """
    log = get_run_logger()
    store = StateStore()
    flow_run_id = current_flow_run_id()
    lease = _current_lease()
    found = reusable_swarm(cfg, store) if reuse else None
    if found is not None and found.name != cfg.name:
        _adopt_unleased(found, store)
        store.put_lease(dataclasses.replace(lease, swarm=found.name))
        log.info(
            "Sharing live swarm '%s' (same engine fingerprint %s): this run holds a lease on it and "
            "stops it only if it is the last holder.",
            found.name,
            found.fingerprint,
        )
        return attach(cfg, found, store)
    existing = store.get_swarm(cfg.name)
    if existing is not None and existing.phase in LIVE_PHASES:
        _adopt_unleased(existing, store)
    swarm = Swarm(cfg, store=store, flow_run_id=flow_run_id, keep=keep, source=source)
    if swarm.join(lease):
        swarm_event(
            "up", cfg.name, source=source, model=cfg.model_name, replicas=cfg.replicas, backend=cfg.backend.type
        )
        log.info(
            "Brought up swarm '%s': %d x %s on %s (wall-time limit: %s).",
            cfg.name,
            cfg.replicas,
            cfg.model,
            cfg.backend.type,
            _wall_time(cfg),
        )
    else:
        log.info(
            "Swarm '%s' is already up (brought up by %s): sharing it; this run holds a lease on it.",
            cfg.name,
            f"flow run {swarm.flow_run_id}" if swarm.flow_run_id else "the CLI",
        )
    return swarm


def _wall_time(cfg: SwarmConfig) -> str:
    backend: Any = cfg.backend
    if backend.type == "local":
        return f"{backend.wall_time_s:g} s" if backend.wall_time_s else "none"
    if backend.type == "slurm":
        return str(backend.time_limit)
    return "backend default"


@task(name="wait-ready", task_run_name="wait-ready-{swarm.cfg.name}", cache_policy=NO_CACHE)
def wait_ready(swarm: Swarm, timeout_s: float | None = None) -> list[str]:
    """Block until every replica answers a chat completion; return the endpoint URL(s)."""
    log = get_run_logger()
    status = swarm.wait_ready(timeout_s)
    swarm_event("ready", swarm.cfg.name, source=swarm.source, healthy=status.healthy, replicas=swarm.cfg.replicas)
    log.info(
        "Swarm '%s' ready: %d/%d replicas healthy at %s.",
        swarm.cfg.name,
        status.healthy,
        swarm.cfg.replicas,
        status.url or swarm.endpoint,
    )
    return swarm.endpoints


@task(
    name="swarm-down",
    task_run_name="swarm-down-{name}",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_on_type,
)
def swarm_down(name: str, owner: str | None = None, force: bool = False) -> bool:
    """Release ``owner``'s lease on swarm ``name`` (default: the KEEP lease of `up`/`keep_swarm`)
    and stop the swarm if no live lease is left; with ``force``, stop it whatever holds it.
    Return whether it was stopped. An unknown name is a StateError (never retried)."""
    from prefect_swarm.tasks.reaper import terminal_runs

    log = get_run_logger()
    swarm = reattach(name)
    if force:
        holders = [x.owner for x in swarm.store.list_leases(name)]
        swarm.down()
        swarm_event("down", name, source=swarm.source, forced=True, held_by=holders)
        log.info("Swarm '%s' stopped (forced; it was held by: %s).", name, ", ".join(holders) or "nobody")
        return True
    owner = owner or KEEP_OWNER
    if swarm.release(owner, terminal_runs=terminal_runs, log=log.info):
        return False
    swarm_event("down", name, source=swarm.source, forced=False, released_by=owner)
    log.info("Swarm '%s' stopped.", name)
    return True


def cancel_flow_run_jobs(flow_run_id: str, store: StateStore | None = None) -> list[str]:
    """Cancel the job processes flow run ``flow_run_id`` started that may still run; return their ids."""
    store = store or StateStore()
    cancelled = []
    for rec in store.jobs_of_flow_run(flow_run_id):
        if rec.status not in launch.ACTIVE or rec.swarm is None or store.get_swarm(rec.swarm) is None:
            continue
        launch.cancel_job(rec.id, store=store, compute=reattach(rec.swarm, store).compute)
        cancelled.append(rec.id)
    return cancelled


def teardown_flow_run(flow_run_id: str, *, include_kept: bool = False, log: Any = None) -> list[str]:
    """Cancel the jobs of flow run ``flow_run_id`` and release its leases; stop each swarm it held
    that no live lease holds any more.

    A swarm it brought up that has no lease at all (recorded before leases existed) is stopped
    unless kept (``include_kept`` stops that too).

    Plain function (no task): called from ``finally``, from cancel/crash hooks (which may run in
    the worker process) and from the reaper. Idempotent. Messages go to ``log`` (default: the
    current run's logger). Returns the swarm names stopped.
    """
    from prefect_swarm.tasks.reaper import terminal_runs

    log = log or run_logger()
    stopped = []
    store = StateStore()
    owner = flow_run_owner(flow_run_id)
    cancelled = cancel_flow_run_jobs(flow_run_id, store)
    if cancelled:
        log.info("Cancelled job(s) %s of flow run %s.", ", ".join(cancelled), flow_run_id)
    for lease in store.leases_of(owner):
        if store.get_swarm(lease.swarm) is None:
            store.release_lease(lease.swarm, owner)
            continue
        if not reattach(lease.swarm, store).release(owner, terminal_runs=terminal_runs, log=log.info):
            swarm_event("down", lease.swarm, flow_run_id=flow_run_id, released_by=owner)
            log.info("Swarm '%s' stopped (flow run %s released the last lease).", lease.swarm, flow_run_id)
            stopped.append(lease.swarm)
    for rec in store.find_swarms_by_flow_run(flow_run_id):
        if rec.phase in LIVE_PHASES and (include_kept or not rec.keep) and not store.list_leases(rec.name):
            reattach(rec.name, store).down()
            log.info("Swarm '%s' stopped (brought up by flow run %s, held by no one).", rec.name, flow_run_id)
            stopped.append(rec.name)
    return stopped


def teardown_owned(keep_swarm: bool) -> None:
    """Release the current flow run's leases as visible ``swarm-down`` tasks (each stops its swarm
    when this run was the last holder), then run the idempotent safety net (which also cancels
    the run's jobs). With ``keep_swarm``, the run's leases become KEEP leases: its swarms stay up
    until `prefect-swarm down` / the ``swarm-down`` flow."""
    run_id = current_flow_run_id()
    if run_id is None:
        return
    store = StateStore()
    owner = flow_run_owner(run_id)
    held = [x.swarm for x in store.leases_of(owner)]
    if not held:
        return
    if keep_swarm:
        for name in held:
            store.put_lease(keep_lease(name))
            store.update_swarm(name, keep=True)
            store.release_lease(name, owner)
            get_run_logger().info("Swarm '%s' kept (keep_swarm): `prefect-swarm down %s` stops it.", name, name)
        return
    try:
        for name in held:
            swarm_down(name, owner=owner)
    finally:
        teardown_flow_run(run_id)


SHARING: tuple[str, ...] = typing.get_args(Sharing)
"""The sharing policies (:data:`prefect_swarm.config.swarm.Sharing`, the ``sharing`` field of the
swarm config): ``shared`` (runs share it, each holding a lease) or ``exclusive`` (one run at a
time: the Prefect global concurrency limit ``swarm:<name>`` of 1)."""


def effective_sharing(cfg: SwarmConfig, sharing: str | None = None) -> str:
    """The policy a run uses on swarm ``cfg``: the flow's ``sharing`` parameter when given, else the
    config's ``sharing`` field."""
    chosen = cfg.sharing if sharing is None else sharing
    if chosen not in SHARING:
        raise ConfigError(f"sharing must be one of {', '.join(SHARING)}, not {chosen!r}.")
    return chosen


@contextmanager
def swarm_use(cfg: SwarmConfig, sharing: str | None = None) -> Iterator[None]:
    """With ``exclusive`` (:func:`effective_sharing`), hold the global concurrency limit
    ``swarm:<name>`` (1 slot; created if missing) for the body, so a second run waits for the slot
    (visible in the UI's Concurrency page); with ``shared``, nothing."""
    name = cfg.name
    sharing = effective_sharing(cfg, sharing)
    if sharing == "shared":
        yield
        return
    from prefect import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists

    limit = f"swarm:{name}"
    with get_client(sync_client=True) as client:
        try:
            client.upsert_global_concurrency_limit_by_name(limit, 1)
        except ObjectAlreadyExists:
            # Prefect's upsert is read-then-create, not atomic: a run started at the same moment
            # created it between the two. Upsert again, which now finds it and sets the limit.
            client.upsert_global_concurrency_limit_by_name(limit, 1)
    log = run_logger()
    log.info("Swarm '%s' is used exclusively: waiting for the concurrency limit '%s' (one run at a time).", name, limit)
    with concurrency(limit, occupy=1, strict=True):
        log.info("Acquired the concurrency limit '%s'.", limit)
        yield
