"""Swarm tasks: resolve the ``swarm`` parameter, bring up (or reuse), wait ready, tear down.

Teardown is owned by flow run: a swarm's SQLite record carries the id of the flow run that
brought it up, so the flow's ``finally``, its hooks and the reaper all find it the same way
(:func:`teardown_flow_run`). A reused swarm belongs to someone else and is never torn down here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_swarm import launch
from prefect_swarm.config import SwarmConfig, load_config
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces import ServingHandle
from prefect_swarm.state import StateStore, SwarmRecord
from prefect_swarm.swarm import LIVE_PHASES, Swarm, engine_fingerprint, missing_secrets
from prefect_swarm.tasks._common import current_flow_run_id, retry_on_type

logger = logging.getLogger("prefect_swarm.tasks")

SWARM_SPEC_SLUG = "swarm-spec"
"""Block type slug of :class:`prefect_swarm.blocks.SwarmSpec` (kept here: blocks are imported lazily)."""

SwarmParam = str | dict[str, Any] | SwarmConfig
"""What a flow's ``swarm`` parameter may be: a SwarmSpec block name, a YAML path, or an inline config."""


def resolve_swarm(swarm: SwarmParam) -> SwarmConfig:
    """Turn a ``swarm`` parameter into a SwarmConfig (secrets from the block or the environment)."""
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
    reload the block's secrets when its environment lacks them.
    """
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


def _check_name_free(cfg: SwarmConfig, store: StateStore, flow_run_id: str | None) -> None:
    rec = store.get_swarm(cfg.name)
    if rec is None or rec.phase not in LIVE_PHASES or rec.flow_run_id == flow_run_id:
        return
    if rec.fingerprint != engine_fingerprint(cfg):
        raise ConfigError(
            f"swarm '{cfg.name}' is live with a different model/engine/backend "
            f"(fingerprint {rec.fingerprint}). "
            f"`prefect-swarm down {cfg.name}` first, or pick another name."
        )


@task(name="swarm-up", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5, retry_condition_fn=retry_on_type)
def swarm_up(cfg: SwarmConfig, keep: bool = False, reuse: bool = True, source: str | None = None) -> Swarm:
    """Reuse a matching live swarm (``reuse``), else start this one, owned by the current flow run.

    ``source`` (see :func:`block_ref`) is recorded so teardown elsewhere can reload the secrets.
    """
    log = get_run_logger()
    store = StateStore()
    flow_run_id = current_flow_run_id()
    found = reusable_swarm(cfg, store) if reuse else None
    if found is not None:
        log.info(
            "Reusing live swarm '%s' (same engine fingerprint %s); it will not be torn down by this run.",
            found.name,
            found.fingerprint,
        )
        return attach(cfg, found, store)
    _check_name_free(cfg, store, flow_run_id)
    swarm = Swarm(cfg, store=store, flow_run_id=flow_run_id, keep=keep, source=source)
    log.info(
        "Bringing up swarm '%s': %d x %s on %s (wall-time limit: %s).",
        cfg.name,
        cfg.replicas,
        cfg.model,
        cfg.backend.type,
        _wall_time(cfg),
    )
    swarm.up()
    return swarm


def _wall_time(cfg: SwarmConfig) -> str:
    backend: Any = cfg.backend
    if backend.type == "local":
        return f"{backend.wall_time_s:g} s" if backend.wall_time_s else "none"
    if backend.type == "slurm":
        return str(backend.time_limit)
    return "backend default"


@task(name="wait-ready", cache_policy=NO_CACHE)
def wait_ready(swarm: Swarm, timeout_s: float | None = None) -> list[str]:
    """Block until every replica answers a chat completion; return the endpoint URL(s)."""
    log = get_run_logger()
    status = swarm.wait_ready(timeout_s)
    log.info(
        "Swarm '%s' ready: %d/%d replicas healthy at %s.",
        swarm.cfg.name,
        status.healthy,
        swarm.cfg.replicas,
        status.url or swarm.endpoint,
    )
    return swarm.endpoints


@task(name="swarm-down", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def swarm_down(name: str) -> None:
    """Stop swarm ``name`` (idempotent); its record stays, phase STOPPED."""
    reattach(name).down()
    get_run_logger().info("Swarm '%s' stopped.", name)


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


def teardown_flow_run(flow_run_id: str, *, include_kept: bool = False) -> list[str]:
    """Cancel the jobs and stop every live swarm that flow run ``flow_run_id`` brought up.

    Kept swarms are stopped only with ``include_kept``.

    Plain function (no task): called from ``finally``, from cancel/crash hooks (which may run in
    the worker process) and from the reaper. Idempotent. Returns the swarm names stopped.
    """
    stopped = []
    store = StateStore()
    cancel_flow_run_jobs(flow_run_id, store)
    for rec in store.find_swarms_by_flow_run(flow_run_id):
        if rec.phase in LIVE_PHASES and (include_kept or not rec.keep):
            reattach(rec.name, store).down()
            stopped.append(rec.name)
    return stopped


def teardown_owned(keep_swarm: bool) -> None:
    """Stop the swarms the current flow run brought up (unless kept), as visible tasks, then run the
    idempotent safety net (which also cancels the run's jobs)."""
    run_id = current_flow_run_id()
    if run_id is None:
        return
    store = StateStore()
    owned = [r for r in store.find_swarms_by_flow_run(run_id) if r.phase in LIVE_PHASES and not r.keep]
    if keep_swarm or not owned:
        return
    try:
        for rec in owned:
            swarm_down(rec.name)
    finally:
        teardown_flow_run(run_id)
