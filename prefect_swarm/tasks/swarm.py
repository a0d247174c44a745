"""Swarm tasks: resolve the ``swarm`` parameter, bring up (or share), wait ready, release.

The public pieces for flows of your own: :func:`hold_swarm` (a context manager yielding a
:class:`LiveSwarm`, always released), and the tasks it is made of, :func:`swarm_up`,
:func:`wait_ready` and :func:`swarm_down` (see docs/own-flow.md).

A flow run holds a lease on every swarm it uses (``flow-run:<id>``, see
:class:`~prefect_swarm.state.LeaseRecord`): the first run brings the swarm up, a concurrent one
waits for it and shares it; whoever lets go last stops it. Holding lives in
:mod:`prefect_swarm.holding`; the Prefect layer gives it Prefect's word on flow runs and the blocks'
secrets (:mod:`prefect_swarm.tasks.word`). The flow's ``finally``, its hooks and the reaper all tear down the same way
(:func:`teardown_flow_run`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_swarm import launch
from prefect_swarm.backends.registry import entry_of
from prefect_swarm.config import SwarmConfig, load_config
from prefect_swarm.config.swarm import Sharing
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.holding import default_holding
from prefect_swarm.interfaces import JobStatus
from prefect_swarm.interfaces.types import ReplicaHealth
from prefect_swarm.settings import get_settings
from prefect_swarm.state import (
    KEEP_OWNER,
    LeaseRecord,
    StateStore,
    SwarmRecord,
    flow_run_lease,
    flow_run_owner,
    process_lease,
)
from prefect_swarm.swarm import LIVE_PHASES, Swarm, missing_secrets
from prefect_swarm.tasks._common import current_flow_run_id, repeating, retry_on_type, run_logger
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
    """Turn a ``swarm`` parameter into a SwarmConfig (secrets from the block or the environment; an
    external swarm's key from the Secret block it names)."""
    from prefect_swarm.blocks import with_secret_key

    return with_secret_key(_resolve_swarm(swarm))


def _resolve_swarm(swarm: SwarmParam) -> SwarmConfig:
    block = _as_block(swarm)
    if block is not None:
        return block.to_config()
    if isinstance(swarm, SwarmConfig):
        return swarm
    if isinstance(swarm, dict):
        return load_config(data=swarm)
    ref = block_ref(swarm)
    if ref is None:
        return load_config(_config_file(swarm))
    return _load_block(ref)


def _config_file(swarm: str) -> Path:
    """The ``swarm`` parameter as a config file this process can read; else a ConfigError for a run's user."""
    path = Path(swarm).expanduser()
    if path.is_file():
        return path
    where = "" if path.is_absolute() else f", relative to this run's working folder {Path.cwd()}"
    raise ConfigError(
        f"swarm: no config file {swarm} on this host{where}. A worker runs each flow in a folder of its own "
        "and reads paths on its own host: give an absolute path the worker can read, or save the config as "
        "a SwarmSpec block (the UI's Blocks page, or `SwarmSpec.from_config(load_config(FILE)).save(NAME)`) "
        "and pass swarm-spec/NAME."
    )


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


def block_secrets(rec: SwarmRecord) -> SwarmConfig | None:
    """The :data:`~prefect_swarm.holding.SecretSource` of the Prefect layer: the SwarmSpec block the
    swarm came from (its record's ``source``), for the secrets the record dropped.

    Teardown runs in processes that may not have the token in their environment (the flow run a
    worker started, the worker's cancel/crash hooks, the reaper): the block still holds it. A block
    that cannot be loaded leaves the environment's (a warning says so)."""
    if rec.source is None:
        return None
    try:
        return _load_block(rec.source)
    except Exception as exc:  # teardown goes on with what the environment has
        logger.warning(
            "swarm '%s': could not reload %s from block '%s' (%s: %s); using the environment's.",
            rec.name,
            " and ".join(missing_secrets(rec.config)),
            rec.source,
            type(exc).__name__,
            exc,
        )
        return None


def current_owner() -> LeaseRecord:
    """The lease the caller holds a swarm with: its flow run's, else (outside a flow) its process's."""
    run_id = current_flow_run_id()
    return flow_run_lease(run_id) if run_id else process_lease()


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
    log.info(
        "Bring-up: swarm '%s' (%d x %s on %s): sharing it when it is live, else bringing it up.",
        cfg.name,
        cfg.replicas,
        cfg.model,
        cfg.backend.type,
    )
    swarm = Swarm(cfg, flow_run_id=current_flow_run_id(), keep=keep, source=source)
    held = default_holding(swarm.store).bring_up(swarm, current_owner(), reuse=reuse)
    if held.shared is not None:
        log.info(
            "Sharing live swarm '%s' (same engine fingerprint %s): this run holds a lease on it and "
            "stops it only if it is the last holder.",
            held.shared,
            held.swarm.fingerprint,
        )
    elif held.restored:
        swarm_event("restored", cfg.name, source=source, replicas=cfg.replicas, backend=cfg.backend.type)
        log.info("Woke swarm '%s': it was parked; restored from its snapshot.", cfg.name)
    elif held.started:
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
    return held.swarm


def _wall_time(cfg: SwarmConfig) -> str:
    return entry_of(cfg.backend).wall_time(cfg.backend)


@task(name="wait-ready", task_run_name="wait-ready-{swarm.cfg.name}", cache_policy=NO_CACHE)
def wait_ready(swarm: Swarm, timeout_s: float | None = None) -> list[str]:
    """Block until every replica answers a chat completion; return the endpoint URL(s)."""
    log = get_run_logger()
    with _readiness_lines(swarm, log):
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


# --- sleep and wake (replicas that free their GPUs and keep their allocation) ---
def live_swarm(name: str) -> Swarm | None:
    """Swarm ``name`` reattached when its record says it is up (a kept swarm, awake or asleep), else None."""
    rec = StateStore().get_swarm(name)
    return default_holding().attach(name) if rec is not None and rec.phase in LIVE_PHASES else None


@task(name="sleep-replicas", task_run_name="sleep-{swarm.cfg.name}", cache_policy=NO_CACHE)
def sleep_replicas(swarm: Swarm, replicas: Sequence[int] = (), level: int = 1) -> list[dict[str, Any]]:
    """Put replicas of ``swarm`` to sleep (all when ``replicas`` is empty): :meth:`Swarm.sleep`."""
    reports = swarm.sleep(replicas, level)
    swarm_event("slept", swarm.cfg.name, source=swarm.source, replicas=[r.index for r in reports], level=level)
    get_run_logger().info(
        "Swarm '%s': replicas %s asleep (level %d) in %.1f s.",
        swarm.cfg.name, [r.index for r in reports], level, max((r.seconds for r in reports), default=0.0),
    )  # fmt: skip
    return [r.to_dict() for r in reports]


@task(name="wake-replicas", task_run_name="wake-{swarm.cfg.name}", cache_policy=NO_CACHE)
def wake_replicas(swarm: Swarm, replicas: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Wake replicas of ``swarm`` (all when ``replicas`` is empty): :meth:`Swarm.wake`."""
    reports = swarm.wake(replicas)
    swarm_event("woke", swarm.cfg.name, source=swarm.source, replicas=[r.index for r in reports])
    get_run_logger().info(
        "Swarm '%s': replicas %s awake in %.1f s.",
        swarm.cfg.name, [r.index for r in reports], max((r.seconds for r in reports), default=0.0),
    )  # fmt: skip
    return [r.to_dict() for r in reports]


READINESS_REPEAT_S = 30.0
"""Longest time between two "Readiness:" lines while what is missing stays the same."""


def _missing(swarm: Swarm) -> tuple[tuple[Any, ...], str]:
    """What swarm ``swarm`` still lacks to be ready, from one non-blocking look at it: a key that
    changes only when a replica's health does, and the line to log."""
    status = swarm.status()
    waiting = [r for r in status.replicas if r.health is not ReplicaHealth.HEALTHY]
    parts = [f"replica {r.index} ({r.health.value}{': ' + r.detail[:120] if r.detail else ''})" for r in waiting]
    detail = f": {status.detail[:120]}" if status.detail else ""
    what = ", ".join(parts) or f"its endpoint ({status.phase.value}{detail})"
    key = (status.phase, status.healthy, tuple((r.index, r.health) for r in waiting))
    return key, f"{status.healthy}/{swarm.cfg.replicas} replicas healthy; not yet: {what}"


@contextmanager
def _readiness_lines(swarm: Swarm, log: Any) -> Iterator[None]:
    """While the body waits for ``swarm``: look at it now and then every ``progress_every_s`` (a thread
    in the run's context); log a "Readiness:" line when a replica's health changes, else every
    READINESS_REPEAT_S."""

    def look(last: tuple[Any, float]) -> tuple[Any, float]:
        try:
            key, line = _missing(swarm)
        except Exception as exc:  # a look at the swarm is a view: never what fails the wait
            key, line = ("unavailable",), f"status unavailable ({exc})"
        if key == last[0] and time.monotonic() - last[1] < READINESS_REPEAT_S:
            return last
        log.info("Readiness: waiting for swarm '%s': %s.", swarm.cfg.name, line)
        return key, time.monotonic()

    seen = [look((None, 0.0))]

    def step() -> None:
        seen[0] = look(seen[0])

    with repeating(get_settings().progress_every_s, step):
        yield


@task(
    name="swarm-down",
    task_run_name="swarm-down-{name}",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_on_type,
)
def swarm_down(name: str, owner: str | None = None, force: bool = False) -> bool:
    """Let go of swarm ``name`` and stop it if no live holder is left; with ``force``, stop it
    whatever holds it. Return whether it was stopped. An unknown name is a StateError (never retried).

    ``owner`` is the hold released; default: the calling run's own (the flow run, or outside a flow
    this process, that brought it up or shares it with :func:`swarm_up`), else the KEEP hold of
    `prefect-swarm up` / ``keep_swarm``. So ``swarm_up`` -> ``wait_ready`` -> ``swarm_down`` in a flow
    of your own stops the swarm unless someone else still holds it."""
    log = get_run_logger()
    hold = default_holding(say=log.info)
    source = hold.store.require_swarm(name).source
    if force:
        holders = hold.stop(name)
        swarm_event("down", name, source=source, forced=True, held_by=holders)
        log.info("Swarm '%s' stopped (forced; it was held by: %s).", name, ", ".join(holders) or "nobody")
        return True
    mine = current_owner().owner
    owner = owner or (mine if hold.holds(name, mine) else KEEP_OWNER)
    if hold.release(name, owner):
        return False
    swarm_event("down", name, source=source, forced=False, released_by=owner)
    log.info("Swarm '%s' stopped.", name)
    return True


@task(name="swarm-park", task_run_name="swarm-park-{name}", cache_policy=NO_CACHE)
def swarm_park(name: str, reason: str = "parked by the swarm-park flow") -> dict[str, Any]:
    """Park swarm ``name``: every GPU given back, the snapshot a fast restore needs kept; its holders
    keep their holds and its jobs pause. Returns the snapshot (no secret). Idempotent."""
    hold = default_holding(say=get_run_logger().info)
    snap = hold.park(name, reason)
    swarm_event("parked", name, source=hold.store.require_swarm(name).source, reason=reason, phase="PARKED")
    get_run_logger().info("Swarm '%s' parked (%s): `prefect-swarm restore %s` brings it back.", name, reason, name)
    return snap.to_dict()


@task(
    name="swarm-restore",
    task_run_name="swarm-restore-{name}",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=5,
    retry_condition_fn=retry_on_type,
)
def swarm_restore(name: str, timeout_s: float | None = None) -> list[str]:
    """Bring the parked swarm ``name`` back from its snapshot and wait until it is ready (one restore
    however many ask at once); its paused jobs go on. Returns its endpoint URL(s)."""
    hold = default_holding(say=get_run_logger().info)
    held = hold.restore(name, timeout_s=timeout_s)
    swarm_event("restored", name, source=held.swarm.source, replicas=held.swarm.cfg.replicas, phase="RUNNING")
    get_run_logger().info("Swarm '%s' restored from its snapshot.", name)
    return held.swarm.endpoints


def cancel_flow_run_jobs(flow_run_id: str, store: StateStore | None = None) -> list[str]:
    """Cancel the job processes flow run ``flow_run_id`` started that may still run; return their ids."""
    hold = default_holding(store)
    cancelled = []
    for rec in hold.store.jobs_of_flow_run(flow_run_id):
        if rec.status not in launch.ACTIVE or rec.swarm is None or hold.store.get_swarm(rec.swarm) is None:
            continue
        if not _still_running(rec.id, hold.store):  # a job that finished is not cancelled (nor said to be)
            continue
        launch.cancel_job(rec.id, store=hold.store, compute=hold.attach(rec.swarm).compute)
        cancelled.append(rec.id)
    return cancelled


def _still_running(job_id: str, store: StateStore) -> bool:
    """Whether job ``job_id`` may still have rows to run, from its ledger (its record is brought up to
    date: a job whose shards all finished is SUCCEEDED or FAILED, not RUNNING); True when unsure."""
    try:
        return JobStatus(launch.job_status(job_id, refresh=False, store=store)["status"]) in launch.ACTIVE
    except Exception:  # unreadable: cancelling a job that ended costs nothing, leaving one running does
        return True


def teardown_flow_run(flow_run_id: str, *, include_kept: bool = False, log: Any = None) -> Teardown:
    """Cancel the jobs of flow run ``flow_run_id`` and let go of what it holds
    (:meth:`~prefect_swarm.holding.Holding.teardown_owner`): each swarm it held stops when no live
    holder is left; one it brought up that nobody holds (recorded before leases existed) stops
    unless kept (``include_kept`` stops that too).

    Plain function (no task): called from ``finally``, from cancel/crash hooks (which may run in
    the worker process) and from the reaper. Idempotent. Messages go to ``log`` (default: the
    current run's logger). Returns what it stopped (jobs cancelled, swarms stopped).
    """
    log = log or run_logger()
    store = StateStore()
    cancelled = cancel_flow_run_jobs(flow_run_id, store)
    if cancelled:
        log.info("Cancelled job(s) %s of flow run %s.", ", ".join(cancelled), flow_run_id)
    owner = flow_run_owner(flow_run_id)
    stopped = default_holding(store, say=log.info).teardown_owner(owner, flow_run_id, include_kept=include_kept)
    for name in stopped:
        swarm_event("down", name, flow_run_id=flow_run_id, released_by=owner)
        log.info("Swarm '%s' stopped (flow run %s let go of it, the last holder).", name, flow_run_id)
    return Teardown(jobs=cancelled, swarms=list(stopped))


@dataclass
class Teardown:
    """What a teardown stopped: the jobs it cancelled, the swarms it stopped."""

    jobs: list[str] = field(default_factory=list)
    swarms: list[str] = field(default_factory=list)

    def __iadd__(self, other: Teardown) -> Teardown:
        self.jobs += other.jobs
        self.swarms += other.swarms
        return self

    def text(self) -> str:
        """For a run's last line: what was stopped, or that the run had let go of everything itself."""
        done = [f"cancelled job(s) {', '.join(self.jobs)}"] if self.jobs else []
        done += [f"stopped swarm(s) {', '.join(self.swarms)}"] if self.swarms else []
        if not done:
            return "nothing was left to stop (the run had already let go of its swarms and stopped its jobs)."
        return "teardown " + " and ".join(done) + "."


def teardown_owned(keep_swarm: bool) -> None:
    """Release the current flow run's holds as visible ``swarm-down`` tasks (each stops its swarm
    when this run was the last holder), then run the idempotent safety net (which also cancels
    the run's jobs). With ``keep_swarm``, the run's holds become the KEEP hold: its swarms stay up
    until `prefect-swarm down` / the ``swarm-down`` flow."""
    run_id = current_flow_run_id()
    if run_id is None:
        return
    hold = default_holding()
    owner = flow_run_owner(run_id)
    held = hold.held_by(owner)
    if not held:
        return
    if keep_swarm:
        for name in held:
            hold.keep(name, owner)
            get_run_logger().info(
                "Release: swarm '%s' kept (keep_swarm): `prefect-swarm down %s` stops it.", name, name
            )
        return
    get_run_logger().info(
        "Release: letting go of swarm(s) %s (each stops when this run was its last holder).", ", ".join(held)
    )
    try:
        for name in held:
            swarm_down(name, owner=owner)
    finally:
        teardown_flow_run(run_id)


@dataclass(frozen=True)
class LiveSwarm:
    """A ready swarm :func:`hold_swarm` holds for you: where to send requests and with what."""

    name: str
    """The swarm's name (``prefect-swarm status NAME``; ``run_job(name=...)`` runs a batch job on it)."""
    model: str
    """The model name requests ask for (the served model name)."""
    endpoint: str
    """Base URL of the OpenAI-compatible API (``{endpoint}/v1/chat/completions``)."""
    endpoints: list[str]
    """Every URL requests may be spread over (the replicas where they are reachable, else ``endpoint``)."""
    api_key: str | None = field(default=None, repr=False)
    """The key the swarm requires (None: none)."""

    @property
    def headers(self) -> dict[str, str]:
        """The HTTP headers a request needs (the bearer key, when the swarm has one)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@contextmanager
def hold_swarm(
    swarm: SwarmParam, *, reuse: bool = True, keep: bool = False, timeout_s: float | None = None
) -> Iterator[LiveSwarm]:
    """Hold a ready swarm for the body of a ``with`` in a flow of your own, and always let go of it.

    ``swarm`` is what a flow's ``swarm`` parameter takes (a SwarmSpec block or its name, a YAML
    path, an inline config, a SwarmConfig). On entry it runs the tasks :func:`swarm_up` (bring it
    up, or share it: a concurrent run waits and shares, with ``reuse`` a live kept swarm of the same
    engine) and :func:`wait_ready`; on exit, however the body ends, :func:`swarm_down` lets go of
    this run's hold: the swarm stops unless another run, job or ``prefect-swarm up`` still holds it.
    With ``keep`` the hold becomes the KEEP hold instead (``prefect-swarm down NAME`` stops it).

    A run cancelled or killed runs no ``finally``: give the flow ``on_cancellation`` and
    ``on_crashed`` hooks :func:`prefect_swarm.flows.hooks.teardown_hook` (the reaper covers a SIGKILL).
    """
    cfg = resolve_swarm(swarm)
    live = swarm_up(cfg, keep=keep, reuse=reuse, source=block_ref(swarm))
    name, owner = live.cfg.name, current_owner().owner
    try:
        endpoints = wait_ready(live, timeout_s)
        key = live.backends.serving.client_key()
        yield LiveSwarm(name, live.cfg.model_name, live.endpoint, endpoints, key)
    finally:
        if keep:
            default_holding().keep(name, owner)
        else:
            swarm_down(name, owner=owner)


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
def swarm_use(
    cfg: SwarmConfig, sharing: str | None = None, *, prefect_client: Callable[[], Any] | None = None
) -> Iterator[None]:
    """With ``exclusive`` (:func:`effective_sharing`), hold the global concurrency limit
    ``swarm:<name>`` (1 slot; created if missing) for the body, so a second run waits for the slot
    (visible in the UI's Concurrency page); with ``shared``, nothing. ``prefect_client`` opens the
    sync Prefect client the limit is made with (default: ``get_client(sync_client=True)``)."""
    name = cfg.name
    sharing = effective_sharing(cfg, sharing)
    if sharing == "shared":
        yield
        return
    from prefect import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists

    limit = f"swarm:{name}"
    with (prefect_client or (lambda: get_client(sync_client=True)))() as client:
        try:
            client.upsert_global_concurrency_limit_by_name(limit, 1)
        except ObjectAlreadyExists:
            # Prefect's upsert is read-then-create, not atomic: a run started at the same moment
            # created it between the two. Upsert again, which now finds it and sets the limit.
            client.upsert_global_concurrency_limit_by_name(limit, 1)
    log = run_logger()
    log.info("Swarm '%s' is used exclusively: waiting for the concurrency limit '%s' (one run at a time).", name, limit)
    with _taking_over(cfg, log) as acquired, concurrency(limit, occupy=1, strict=True):
        acquired()
        log.info("Acquired the concurrency limit '%s'.", limit)
        yield


TAKEOVER_LOOK_S = 1.0
"""Seconds between two looks, while a run waits for an exclusive swarm, at whether it can take it over."""


@contextmanager
def _taking_over(cfg: SwarmConfig, log: Any) -> Iterator[Callable[[], None]]:
    """While a run waits for an exclusive swarm's slot (until it calls the callable this yields), hold
    the swarm when it is live with the same config (:meth:`~prefect_swarm.holding.Holding.hold_if_same`,
    a look every TAKEOVER_LOOK_S), so the run ahead, letting go, leaves it up for this one instead of
    stopping it (and this run bringing it up again). A swarm of another config is not held: it stops,
    this run brings up its own. If the wait fails, the hold is let go (the swarm stops when this run
    was its last holder); once the slot is acquired the run's own teardown lets go of it."""
    run_id = current_flow_run_id()
    if run_id is None:  # outside a flow run nothing holds for it
        yield lambda: None
        return
    hold, lease, held = default_holding(say=log.info), flow_run_lease(run_id), threading.Event()

    def look() -> None:
        if held.is_set():
            return
        try:
            if hold.hold_if_same(cfg, lease):
                held.set()
                log.info(
                    "Swarm '%s' is up with this run's config: this run holds it while it waits, so the run "
                    "ahead hands it over instead of stopping it.",
                    cfg.name,
                )
        except Exception as exc:  # a missed takeover costs a bring-up, never the run
            log.warning("could not hold swarm '%s' while waiting: %s", cfg.name, exc)

    waiting = contextlib.ExitStack()
    look()
    waiting.enter_context(repeating(TAKEOVER_LOOK_S, look))
    acquired: list[bool] = []

    def got_it() -> None:
        acquired.append(True)
        waiting.close()

    try:
        yield got_it
    except BaseException:
        waiting.close()
        if not acquired and held.is_set():  # the wait itself failed: nothing else lets go of the hold
            hold.release(cfg.name, lease.owner)
        raise
    finally:
        waiting.close()
