"""Serving on DGX Cloud Lepton: the swarm is one Lepton endpoint (deployment) with N replicas.

Lepton balances requests over the replicas and replaces failed ones itself, so there is no
watchdog here. Readiness is the deployment's state *and* one real chat completion through the
endpoint. The endpoint's token is the swarm's ``api_key`` (sent as the endpoint's API token) or a
Lepton secret named by ``backend.endpoint_token_secret``; it reaches no log or state row.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prefect_swarm.backends.engine import engine_argv, engine_env
from prefect_swarm.backends.lepton.client import (
    LABEL_OWNER,
    LABEL_SWARM,
    OWNED_DEPLOYMENT_FIELDS,
    OWNER_ENV,
    LeptonClient,
    affinity,
    check_catalogs,
    env_vars,
    import_sdk,
    is_conflict,
    mounts,
    owner_mark,
    read_log,
    reservation_config,
    secret_prefix,
    swarm_owner,
    validate_lepton,
    with_passthrough,
)
from prefect_swarm.backends.lepton.compute import LeptonCompute
from prefect_swarm.backends.sleep import SleepRefused
from prefect_swarm.exceptions import BackendError, CapacityError, ConfigError, PrefectSwarmError, ReadinessError
from prefect_swarm.interfaces import Capabilities, Capability, JobRequest, ServingHandle
from prefect_swarm.interfaces.metrics import MetricsTargets
from prefect_swarm.interfaces.readiness import check_answer
from prefect_swarm.interfaces.types import ReplicaHealth, ReplicaStatus, ServingPhase, ServingStatus
from prefect_swarm.interfaces.usage import GpuUsage

if TYPE_CHECKING:
    from prefect_swarm.config import LeptonConfig, SwarmConfig
    from prefect_swarm.paths import SwarmPaths

log = logging.getLogger(__name__)

DEPLOYMENT_PHASES: dict[str, ServingPhase] = {
    "Ready": ServingPhase.RUNNING,
    "Migrating": ServingPhase.RUNNING,  # live-migrating replicas keep serving
    "Not Ready": ServingPhase.INITIALIZING,  # Lepton restarts unready replicas itself
    "Starting": ServingPhase.INITIALIZING,
    "Updating": ServingPhase.INITIALIZING,
    "Scaling": ServingPhase.INITIALIZING,
    "Restarting": ServingPhase.INITIALIZING,
    "Stopping": ServingPhase.STOPPED,
    "Stopped": ServingPhase.STOPPED,
    "Deleting": ServingPhase.STOPPED,
    "Error": ServingPhase.FAILED,
    "UNK": ServingPhase.UNKNOWN,
}
"""Every ``LeptonDeploymentState`` value -> our phase (tests check the table covers the enum)."""

OWNER_PLACEHOLDER = "<owner>"
"""Stands for the swarm's identity in the rendered plan (it is made at the first ``up``)."""
MASK = "***"
"""Stands for a secret in the rendered plan."""
QUEUED_REASONS = frozenset({"NoCapacity", "Queueing"})
FATAL_REASONS = frozenset({"ConfigError"})
DELETE_WAIT_S = 60.0
KEY_REFUSED_PROBES = 3
"""Chat probes in a row the Ready endpoint answers 401/403 after which readiness fails: the key is
wrong, not the gateway slow to take a new token."""
CRASH_LOOP_RESTARTS = 3
"""Exits of one replica after which readiness gives up rather than wait for ``ready_timeout_s``."""
FOLLOW_RECONNECTS = 5
"""Log-stream connections in a row that may drop before ``logs --follow`` gives up."""
LOG_QUIET_S = 3
"""``prefect-swarm logs`` without --follow: a live replica's stream is read until quiet this long."""
SECRET_ENV_NAMES = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
"""Engine variables that are credentials: refused in plain env, taken through ``backend.secret_env``."""
CRASH_LOOP_REASONS = frozenset({"BackOff", "CrashLoopBackOff"})
"""Event reasons of a container the platform keeps restarting (Kubernetes' kubelet names)."""
_UNSCHEDULED = "Queueing: no node has taken the replica yet"
"""A replica's detail on the new Endpoint API while it is not scheduled (read as queued)."""
_NO_READINESS = object()
"""What the readiness (or termination) read returns when the workspace's API has no such route."""


def deployment_phase(state: str | None, phase: str | None = None) -> ServingPhase:
    """Our phase for a deployment ``state`` (``phase`` wins when it says Stopping/Stopped)."""
    if phase in ("Stopping", "Stopped"):
        return ServingPhase.STOPPED  # the legacy API collapses these into state "Not Ready"
    return DEPLOYMENT_PHASES.get(state or "UNK", ServingPhase.UNKNOWN)


def engine_command(cfg: SwarmConfig) -> list[str]:
    """The container command of one replica (no secret: Lepton's gateway checks the endpoint token)."""
    if cfg.engine.python is None:  # this machine's interpreter means nothing inside the image
        cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"python": "python3"})})
    return engine_argv(cfg, host="0.0.0.0", port=cfg.port)


class LeptonServing(SleepRefused):
    """The swarm as one Lepton deployment, through the leptonai SDK."""

    def __init__(self, cfg: SwarmConfig, paths: SwarmPaths) -> None:
        self.cfg = cfg
        self.paths = paths
        self.backend: LeptonConfig = cfg.backend  # type: ignore[assignment]
        self.client = LeptonClient(self.backend)

    @functools.cached_property
    def owner(self) -> str:
        """This home's identity of the swarm (:func:`swarm_owner`), marked on what it makes."""
        return swarm_owner(self.paths)

    # ---------------------------------------------------------------- protocol
    def capabilities(self) -> Capabilities:
        """Lepton balances and replaces replicas itself; it sends no preemption signal."""
        return Capabilities.all_but(
            "lepton",
            {
                Capability.WATCHDOG: "Lepton replaces replicas itself",
                Capability.PREEMPTION_SIGNAL: "Lepton sends jobs no preemption signal; a retried job resumes "
                "from its ledger",
                Capability.WALL_TIME: "Lepton endpoints have no wall-time limit; the flow's teardown and the "
                "orphan reaper stop them",
                Capability.SLEEP_WAKE: "Lepton routes requests to its replicas itself and exposes no replica's own "
                "port, so no replica can be put to sleep or taken out of the endpoint's rotation",
                Capability.EXEC: "Lepton's API offers no way to run a command inside a deployment replica; "
                "use the Lepton dashboard's terminal, or `curl` the endpoint from here",
            },
        )

    def park(self, handle: ServingHandle) -> dict[str, Any]:
        """Scale the endpoint to zero replicas (the SDK's ``deployment.stop``: ``min_replicas`` 0; it reads
        Stopped); the deployment, its URL, its secrets and the swarm's jobs' mounts stay. A deployment
        another swarm made is refused (ConfigError), as ``up`` refuses it. Idempotent."""
        name = handle.name
        dep = self._get(name)
        if dep is None:
            return {"deployment": name, "url": handle.url}
        self._check_owner(name, dep)
        if _state(dep) not in ("Stopped", "Stopping"):
            log.info("scaling Lepton deployment '%s' to zero replicas (parked)", name)
            self.client.call(f"stop deployment '{name}'", lambda api: api.deployment.stop(name))
        return {"deployment": name, "url": _url(dep) or handle.url}

    def restore(self, cfg: SwarmConfig, parked: dict[str, Any]) -> ServingHandle:
        """Scale the endpoint back to ``cfg.replicas`` (:meth:`create_or_update` with the swarm's spec: the
        same deployment, so the same URL)."""
        del parked  # the deployment keeps its name and URL
        return self.create_or_update(cfg)

    def exec_command(self, handle: ServingHandle, replica: int, argv: Sequence[str]) -> int:
        """Refused: ConfigError with the reason Lepton lacks :attr:`Capability.EXEC`; calls nothing."""
        del handle, replica, argv
        self.capabilities().require(Capability.EXEC, "prefect-swarm exec")
        raise AssertionError("unreachable: Lepton lacks the exec capability")

    def validate(self, cfg: SwarmConfig, *, ask: bool = True) -> list[str]:
        """Refuse a config this backend cannot run (no SDK, no shared mount). Needs no token, calls
        nothing. Warns when the endpoint's token cannot be checked at readiness (only in a secret)."""
        validate_lepton(cfg.backend)  # type: ignore[arg-type]
        import_sdk()
        from leptonai.api.v2.spec_utils import make_mounts_from_strings, validate_environment_variable_name

        for name in engine_env(cfg):  # the platform refuses these; the SDK checks them for jobs only
            try:
                validate_environment_variable_name(name)
            except ValueError as exc:
                raise ConfigError(f"env / engine.env: {name!r} cannot be used on Lepton: {exc}") from None
            if name in SECRET_ENV_NAMES:
                raise ConfigError(
                    f"env / engine.env: {name} would sit in plain text in the Lepton endpoint's spec. Keep it in "
                    f"a workspace secret (`lep secret create -n {name.lower().replace('_', '-')} -v ...`) and "
                    f"name it in backend.secret_env: {{{name}: {name.lower().replace('_', '-')}}}."
                )
        _check_secret_env(cfg)
        self.plan()  # backend.deployment_spec / job_spec merged and checked by the SDK's models
        for i, m in enumerate(cfg.backend.mounts):  # type: ignore[union-attr]
            try:  # the SDK's own check of a volume name (node-local, or node-<type>:<name>)
                make_mounts_from_strings([f"{m.path}:{m.mount_path}:{m.from_}"])
            except ValueError as exc:
                raise ConfigError(f"backend.mounts[{i}].from: {exc}") from None
        unverified = cfg.api_key is None and cfg.backend.endpoint_token_secret  # type: ignore[union-attr]
        return [self._unverified_token()] if unverified else []

    def _unverified_token(self) -> str:
        """Why the endpoint's token is not checked at readiness (api_key unset, the token only in a secret)."""
        secret = self.backend.endpoint_token_secret
        return (
            f"the endpoint's token is only in workspace secret '{secret}', which cannot be read back: readiness "
            "cannot send the key jobs will use, and skips the chat probe. Set api_key (or PREFECT_SWARM_API_KEY) "
            "to the token that secret holds, and readiness checks the endpoint accepts it"
        )

    def plan(self) -> dict[str, str]:
        """The deployment spec ``up`` sends and the template of a job's spec, as JSON; secrets masked."""
        job = LeptonCompute(self.cfg, self.paths, None)
        job.owner = OWNER_PLACEHOLDER  # validate writes nothing: the identity is made at `up`
        request = JobRequest(
            name="<job>", command=job.job_runtime().module_argv("prefect_swarm.jobs.run", "--spec", "<spec.json>")
        )
        return {
            "deployment.json": _json(self._spec(self.cfg, mask=True)),
            "job-template.json": _json(job.job_spec(request, "<job>-<rand>-0", 0, refs=job.secret_names(request))),
        }

    def create_or_update(self, cfg: SwarmConfig) -> ServingHandle:
        """Create the deployment, or update its spec when it already exists (never a duplicate)."""
        for warning in self.validate(cfg):
            log.warning("%s", warning)
        self.client.check_access()
        name = cfg.name
        existing = self._get(name)
        if existing is not None and _state(existing) != "Deleting":
            self._check_owner(name, existing)  # before any change: a name another made is refused
        if existing is not None and _state(existing) == "Deleting":
            if not self._wait_gone(name):
                raise BackendError(
                    f"Lepton deployment '{name}' is still being deleted after {DELETE_WAIT_S:.0f}s "
                    f"(workspace '{self.backend.workspace_id}').",
                    hint="wait for it to go, then retry `up`.",
                )
            existing = None
        # node groups first (given by id or name; the specs take ids): the shapes are listed per node group
        self.backend = check_catalogs(self.client)
        cfg = cfg.model_copy(update={"backend": self.backend})
        spec = self._spec(cfg, labels=not self._new_api())
        self._check_shapes()
        self._check_secrets()
        compute = LeptonCompute(cfg, self.paths, None)
        compute.owner = self.owner
        compute.stage_wheel()  # before the check: its setup installs it as every job's does
        if existing is None and self.backend.storage_check_timeout_s is not None:
            compute.check_shared_storage(self.backend.storage_check_timeout_s)
        compute.put_swarm_secrets()
        if existing is None:
            log.info("creating Lepton deployment '%s' in workspace '%s'", name, self.backend.workspace_id)
            try:
                dep = self._create(name, spec)
            except PrefectSwarmError:
                self._clean_failed_create(name)
                raise
        else:
            log.info("updating Lepton deployment '%s' in workspace '%s'", name, self.backend.workspace_id)
            dep = self.client.call(f"update deployment '{name}'", lambda api: api.deployment.update(name, spec))
        return self._handle(name, dep)

    def _create(self, name: str, spec: Any) -> Any:
        """Create deployment ``name``; the deployment as the API then shows it.

        An old server answers a successful create with an empty body: tolerated, as the SDK's CLI
        does (``tolerate_legacy_response``), and the deployment read back. Deletes finish in the
        background, so a create right after a delete of the same name can meet HTTP 409 from the old
        deployment: retried while no live deployment holds the name, for up to DELETE_WAIT_S (the
        SDK's CLI, ``_create_after_new_api_rerun``, waits 60 s the same way)."""
        deadline = time.monotonic() + DELETE_WAIT_S
        while True:
            try:
                dep = self.client.call(
                    f"create deployment '{name}'",
                    lambda api: api.deployment.create_with_response(spec, tolerate_legacy_response=True),
                )
                break
            except BackendError as exc:
                if not is_conflict(exc):
                    raise
                held = self._get(name)
                if held is not None and _state(held) != "Deleting" and owner_mark(held) == self.owner:
                    # an earlier try of this create went through (a 504 after the gateway passed it
                    # on), or another `up` of this swarm from this home made it: the same spec, ours
                    log.info("adopting Lepton deployment '%s', created by an earlier try of this swarm", name)
                    return held
                if held is not None and _state(held) != "Deleting":
                    self._check_owner(name, held)
                if (held is not None and _state(held) != "Deleting") or time.monotonic() >= deadline:
                    raise BackendError(
                        f"Lepton deployment '{name}' exists already (workspace '{self.backend.workspace_id}')"
                        + ("" if held is not None else f"; its delete had not finished after {DELETE_WAIT_S:.0f}s")
                        + ".",
                        hint="another `up` of this swarm name may be running; wait for it, or `down` first.",
                    ) from exc
                log.info("Lepton deployment '%s' is still being deleted; retrying the create", name)
                time.sleep(min(1.0, self.backend.ready_poll_s))
        if not hasattr(dep, "status"):  # an old server answered with an empty body
            dep = self._get(name)
        return dep

    def _clean_failed_create(self, name: str) -> None:
        """After a create that failed: a deployment of ``name`` carrying this swarm's mark was made by
        a try whose answer was lost (a 504 after the gateway passed the request on) and is not wanted:
        deleted, so it is not billed until the next ``up``. One not ours is left alone."""
        try:
            held = self._get(name)
            if held is not None and _state(held) != "Deleting" and owner_mark(held) == self.owner:
                log.warning("deleting Lepton deployment '%s': its create failed, but one try of it went through", name)
                self.client.call(
                    f"delete deployment '{name}'", lambda api: api.deployment.delete(name), missing_ok=True
                )
        except PrefectSwarmError as exc:  # the API is still down: `down` (which a failed `up` runs) retries
            log.warning("could not check for a Lepton deployment '%s' left by the failed create: %s", name, exc)

    def wait_ready(self, handle: ServingHandle, timeout_s: float) -> ServingStatus:
        """Poll the deployment until Ready and one chat completion answers through the endpoint.
        CapacityError once every replica has waited for capacity ``backend.queue_timeout_s``."""
        deadline = time.monotonic() + timeout_s
        last = "no status yet"
        queued_since: float | None = None
        refused = 0
        while True:
            st = self.status(handle)
            queued_since = (queued_since or time.monotonic()) if st.phase is ServingPhase.PENDING else None
            limit = self.backend.queue_timeout_s
            if queued_since is not None and limit is not None and time.monotonic() - queued_since >= limit:
                raise self._queued(handle, limit, st)
            if st.phase is ServingPhase.FAILED or st.phase is ServingPhase.STOPPED:
                raise self._not_ready(handle, f"deployment is {st.detail}")
            if _fatal(st):
                raise self._not_ready(handle, f"a replica cannot start: {st.detail}")
            crashes = self._crash_loop(handle.name) if st.phase is not ServingPhase.RUNNING else None
            if crashes:
                raise self._not_ready(handle, f"is crash-looping: {crashes}")
            if st.phase is ServingPhase.RUNNING:
                ok, last = self._probe_chat(st.url or handle.url)
                if ok:
                    return ServingStatus(ServingPhase.RUNNING, st.url, last, st.replicas)
                refused = (
                    refused + 1 if last.startswith(("Ready, but chat: HTTP 401", "Ready, but chat: HTTP 403")) else 0
                )
                if refused >= KEY_REFUSED_PROBES:
                    raise self._key_refused(handle, last)
            else:
                last = st.detail
            if time.monotonic() >= deadline:
                if st.phase is ServingPhase.PENDING:
                    raise self._queued(handle, timeout_s, st)
                raise self._not_ready(handle, f"not ready after {timeout_s:.0f}s; last: {last}")
            time.sleep(min(self.backend.ready_poll_s, max(0.0, deadline - time.monotonic())))

    def status(self, handle: ServingHandle) -> ServingStatus:
        """The deployment now: its state mapped to a phase, each replica's readiness."""
        try:
            dep = self._get(handle.name)
        except BackendError as exc:
            return ServingStatus(ServingPhase.UNKNOWN, handle.url, f"Lepton API: {exc}".splitlines()[0])
        if dep is None:
            return ServingStatus(ServingPhase.STOPPED, handle.url, "deployment does not exist")
        state = _state(dep)
        phase = deployment_phase(state, _phase(dep))
        replicas = self._replicas(handle.name, state) if phase is not ServingPhase.STOPPED else ()
        if (
            phase is ServingPhase.INITIALIZING
            and replicas
            and all(r.detail.split(":")[0] in QUEUED_REASONS for r in replicas)
        ):
            phase = ServingPhase.PENDING
        detail = state + "".join(f"; replica {r.index}: {r.detail}" for r in replicas if r.detail)
        return ServingStatus(phase, _url(dep) or handle.url, detail, replicas)

    def delete(self, handle: ServingHandle) -> None:
        """Delete the deployment, the swarm's jobs and secrets. Idempotent; waits until it is gone."""
        name = handle.name
        self._delete_jobs(name)
        dep = self._get(name)
        if dep is not None and owner_mark(dep) != self.owner:
            log.warning(
                "Lepton deployment '%s' was not made by this swarm (%s): left as it is. To remove it with "
                "prefect-swarm, `up --adopt` it first, then `down`",
                name,
                _made_by(dep),
            )
        elif dep is not None:
            self.client.call(f"delete deployment '{name}'", lambda api: api.deployment.delete(name), missing_ok=True)
            if not self._wait_gone(name):
                log.warning("Lepton deployment '%s' is still being deleted after %.0fs", name, DELETE_WAIT_S)
        self.client.delete_secrets(secret_prefix(name, self.owner))

    def gpu_usage(self, handle: ServingHandle) -> GpuUsage:
        """The deployment's age x its replicas x GPUs per replica, priced per ``resource_shape``.

        A deleted deployment has no age left to read: n/a with the reason (the workspace's billing
        page has it)."""
        shape, gpus = self.backend.resource_shape, self.cfg.replicas * max(self.cfg.gpus_per_replica, 0)
        dep = self._get(handle.name)
        created_ms = getattr(dep.metadata, "created_at", None) if dep is not None else None
        if not created_ms:
            why = "the deployment is gone" if dep is None else "the deployment has no creation time"
            return GpuUsage(None, "n/a", shape=shape, reason=f"{why}; the Lepton workspace's billing has its hours")
        hours = max(0.0, time.time() - float(created_ms) / 1000) * gpus / 3600.0
        return GpuUsage(hours, "lepton deployment age", shape=shape, gpus=gpus)

    def replica_log(self, handle: ServingHandle, replica: int, *, follow: bool = False) -> Iterator[str]:
        """Replica ``replica``'s log (the deployment's replicas in id order) as the API streams it.
        Without ``follow`` the stream is read until it goes quiet for LOG_QUIET_S (the SDK's read timeout);
        with it, until the replica's stream ends or the connection drops (the SDK's ``get_log`` with no
        timeout streams "indefinitely", leptonai 0.47.1 api/v2/deployment.py / endpoint.py)."""
        name = handle.name
        reps = self.client.call(
            f"list replicas of '{name}'", lambda api: api.deployment.get_replicas(name), missing_ok=True
        )
        ordered = sorted(reps or [], key=lambda r: str(r.id_))
        if replica >= len(ordered):
            raise ReadinessError(
                f"Lepton deployment '{name}' has {len(ordered)} replica(s) now: replica {replica} has no log.",
                hint=f"`prefect-swarm status {name}` shows its replicas.",
            )
        rep = ordered[replica]
        if not follow:
            text = self.client.call(
                f"read log of '{rep.id_}'", lambda api: read_log(api.deployment.get_log(name, rep, timeout=LOG_QUIET_S))
            )
            return iter([text] if text else [])
        return self._follow(name, rep)

    def _follow(self, name: str, rep: Any) -> Iterator[str]:
        """Replica ``rep``'s log, followed: the SDK's stream with no timeout, opened again when the
        connection drops ("connections can be dropped when streamed for a long time", leptonai 0.47.1
        ``get_log``). Each stream starts from the log's beginning, so what was printed already is
        skipped. Ends when a stream ends (the replica stopped), the replica is gone, or
        FOLLOW_RECONNECTS connections in a row dropped before giving anything."""
        import requests
        from urllib3.exceptions import HTTPError as Urllib3Error

        printed = drops = 0
        while True:
            skip = printed
            try:
                for chunk in self.client.api.deployment.get_log(name, rep, timeout=None):
                    part = chunk[skip:]
                    skip = max(0, skip - len(chunk))
                    if part:
                        printed, drops = printed + len(part), 0
                        yield part
                return
            except (requests.RequestException, Urllib3Error) as exc:
                drops += 1
                reps = self.client.call(
                    f"list replicas of '{name}'", lambda api: api.deployment.get_replicas(name), missing_ok=True
                )
                if drops > FOLLOW_RECONNECTS or rep.id_ not in {r.id_ for r in reps or []}:
                    log.warning(
                        "the log stream of replica '%s' dropped (%s); not reconnecting", rep.id_, type(exc).__name__
                    )
                    return
                log.info("the log stream of replica '%s' dropped (%s); reconnecting", rep.id_, type(exc).__name__)
                time.sleep(min(5.0, 0.2 * 2**drops))
            except RuntimeError:  # the SDK's answer to a refused stream (the replica went away)
                return

    def client_key(self) -> str | None:
        """See :meth:`ServingBackend.client_key`."""
        return self.cfg.api_key.get_secret_value() if self.cfg.api_key is not None else None

    def key_sources(self) -> list[str]:
        """See :meth:`ServingBackend.key_sources`: none beyond the swarm's own."""
        return []

    def metrics_targets(self, handle: ServingHandle) -> MetricsTargets:
        """None: n/a with the reason (the endpoint's replicas are reached only through Lepton's gateway)."""
        del handle
        return MetricsTargets(
            reason="Lepton routes every request through its gateway: replica engines' /metrics are not reachable"
        )

    # ---------------------------------------------------------------- internals
    def _queued(self, handle: ServingHandle, waited_s: float, st: ServingStatus) -> CapacityError:
        b = self.backend
        return CapacityError(
            f"Lepton deployment '{handle.name}' stayed queued for capacity for {waited_s:.0f}s "
            f"(workspace '{b.workspace_id}', resource_shape {b.resource_shape}): {st.detail}. Try another "
            "resource_shape or node group, retry later, or raise backend.queue_timeout_s."
        )

    def _crash_loop(self, name: str) -> str | None:
        """What a replica that keeps crashing said (Lepton restarts it, so the state never turns
        Error); None while no replica crashed CRASH_LOOP_RESTARTS times, or the API cannot tell."""
        from leptonai.api.v2.endpoint import NewEndpointAPIUnsupported

        def terminations(api: Any) -> Any:
            try:
                return api.deployment.get_termination(name)
            except NewEndpointAPIUnsupported:  # the new Endpoint API has no termination route
                return _NO_READINESS

        found = self.client.call(f"read terminations of '{name}'", terminations, missing_ok=True)
        if found is _NO_READINESS:
            return self._crash_loop_events(name)
        for rid, items in sorted((getattr(found, "root", None) or {}).items()):
            if len(items) >= CRASH_LOOP_RESTARTS:
                last = items[-1]
                return (
                    f"replica {rid} exited {len(items)} times, last with code {last.exit_code} "
                    f"({last.reason}): {last.message[-300:]}"
                )
        return None

    def _crash_loop_events(self, name: str) -> str | None:
        """A crash loop as the new Endpoint API shows it: its events route (the same Kubernetes event
        list as the legacy route, leptonai 0.47.1 api/v2/endpoint.py ``get_events``) carries the
        kubelet's ``BackOff`` event, counted once per restart it delayed."""
        events = self.client.call(
            f"read events of '{name}'", lambda api: api.deployment.get_events(name), missing_ok=True
        )
        for event in events or []:
            if event.reason in CRASH_LOOP_REASONS and event.count >= CRASH_LOOP_RESTARTS:
                return f"the platform restarted a replica {event.count} times ({event.type_} {event.reason})"
        return None

    def _check_owner(self, name: str, dep: Any) -> None:
        """ConfigError when deployment ``name`` does not carry this swarm's mark and ``backend.adopt``
        is off: another user's swarm of the same name, or one made by hand, is never taken over (the
        SDK's own ``lep endpoint create`` refuses an existing name at once, cli/deployment.py)."""
        if owner_mark(dep) == self.owner or self.backend.adopt:
            if owner_mark(dep) != self.owner:
                log.warning(
                    "adopting Lepton deployment '%s' (%s): `up` updates it, `down` deletes it", name, _made_by(dep)
                )
            return
        raise ConfigError(
            f"name '{name}' is taken by a Lepton endpoint not made by this swarm ({_made_by(dep)}; this swarm "
            f"is '{self.owner}', workspace '{self.backend.workspace_id}'): pick another name or `--adopt` "
            "(`up --adopt` takes it over: its spec is replaced and `down` deletes it). Nothing was changed."
        )

    def _check_secrets(self) -> None:
        """``endpoint_token_secret`` and each ``secret_env`` secret must be a secret of the workspace
        (a misspelt one would leave the endpoint's token, every job's API key, or the engine's
        variable unresolvable)."""
        b = self.backend
        wanted = [("backend.endpoint_token_secret", b.endpoint_token_secret)] if b.endpoint_token_secret else []
        wanted += [(f"backend.secret_env.{env}", name) for env, name in b.secret_env.items()]
        wanted += [(f"backend.job_secret_env.{env}", name) for env, name in b.job_secret_env.items()]
        if not wanted:
            return
        names = self.client.secret_names()
        for field, name in wanted:
            if name not in names:
                raise ConfigError(
                    f"{field}: workspace '{b.workspace_id}' has no secret '{name}'. Create it "
                    f"(`lep secret create -n {name} -v ...`) or fix the name."
                )

    def _check_shapes(self) -> None:
        """``resource_shape`` (for endpoints) and ``job_resource_shape`` (for jobs) must be shapes of
        the node groups the workloads may use. Shapes are listed per node group and purpose and named
        by ``spec.name`` (leptonai 0.47.1 cli/node.py ``resource_shape_command``)."""
        b = self.backend
        where = f"workspace '{b.workspace_id}'" + (
            f" on node groups {', '.join(b.node_groups)}" if b.node_groups else ""
        )
        for field, shape, purpose in (
            ("resource_shape", b.resource_shape, "deployment"),
            ("job_resource_shape", b.job_resource_shape, "job"),
        ):
            known: set[str] = set()
            groups: list[str | None] = [*b.node_groups] or [None]
            for group in groups:
                shapes = self._shapes(group, purpose)
                if shapes is None:  # a workspace without the shapes route: the create call will tell
                    return
                known |= {_shape_name(s) for s in shapes}
            if shape not in known:
                raise ConfigError(
                    f"backend.{field}: {where} has no resource shape '{shape}' for {purpose}s; "
                    f"it has: {', '.join(sorted(known)) or 'none'}."
                )

    def _shapes(self, group: str | None, purpose: str) -> list[Any] | None:
        """The shapes of node group ``group`` (an id; None: all) usable for ``purpose``; None when the
        workspace has no shapes route. As the SDK's CLI (leptonai 0.47.1 cli/node.py
        ``resource_shape_command``): asked by the group's id, then by its name when the id finds
        nothing (``list_shapes`` documents a node group *name* filter), and kept when its
        ``listable_in`` holds the purpose."""

        def ask(by: str | None) -> list[Any] | None:
            return self.client.call(
                "list resource shapes",
                lambda api, g, p: api.shapes.list_shapes(node_group=g, purpose=p),
                by,
                purpose,
                missing_ok=True,
            )

        shapes = ask(group)
        name = self.client.group_names.get(group or "")
        if shapes is not None and not shapes and name and name != group:
            shapes = ask(name)
        if shapes is None:
            return None
        return [s for s in shapes if _listable(s, purpose)]

    def _new_api(self) -> bool:
        """True when the workspace serves endpoints through the new Endpoint API (no labels, no
        per-deployment readiness); the SDK reads the flag from the workspace once per process."""
        return bool(self.client.call("read the workspace's deployment API", lambda api: api.new_deployment_api_enabled))

    def _spec(self, cfg: SwarmConfig, mask: bool = False, labels: bool = True) -> Any:
        from leptonai.api.v2.types.common import Metadata
        from leptonai.api.v2.types.deployment import (
            ContainerPort,
            LeptonContainer,
            LeptonDeployment,
            LeptonDeploymentUserSpec,
            ResourceRequirement,
            TokenValue,
            TokenVar,
        )

        b = self.backend
        if b.endpoint_token_secret:
            tokens = [TokenVar(value_from=TokenValue(token_name_ref=b.endpoint_token_secret))]
        elif cfg.api_key is not None:
            tokens = [TokenVar(value=MASK if mask else cfg.api_key.get_secret_value())]
        else:
            tokens = []
        if not tokens and not mask:
            log.warning(
                "Lepton endpoint '%s' will accept requests without a token: set api_key or "
                "backend.endpoint_token_secret to require one",
                cfg.name,
            )
        user_spec = LeptonDeploymentUserSpec(
            container=LeptonContainer(
                image=b.image, command=engine_command(cfg), ports=[ContainerPort(container_port=cfg.port)]
            ),
            resource_requirement=ResourceRequirement(
                resource_shape=b.resource_shape,
                min_replicas=cfg.replicas,
                max_replicas=cfg.replicas,
                affinity=affinity(b),
            ),
            api_tokens=tokens,
            allow_unauthenticated_access=not tokens,  # false with tokens, as the SDK's CLI sends
            envs=env_vars({**engine_env(cfg), OWNER_ENV: OWNER_PLACEHOLDER if mask else self.owner}, b.secret_env),
            mounts=mounts(b),
            image_pull_secrets=list(b.image_pull_secrets) or None,
            reservation_config=reservation_config(b),
        )
        return LeptonDeployment(
            metadata=Metadata(
                id=cfg.name,
                name=cfg.name,
                labels={LABEL_SWARM: cfg.name, LABEL_OWNER: OWNER_PLACEHOLDER if mask else self.owner}
                if labels
                else None,
            ),
            spec=with_passthrough(user_spec, b.deployment_spec, "deployment_spec", OWNED_DEPLOYMENT_FIELDS),
        )

    def _get(self, name: str) -> Any:
        return self.client.call(f"read deployment '{name}'", lambda api: api.deployment.get(name), missing_ok=True)

    def _handle(self, name: str, dep: Any) -> ServingHandle:
        endpoint = getattr(getattr(dep, "status", None), "endpoint", None)
        meta = {
            "workspace_id": self.backend.workspace_id,
            "deployment": name,
            "internal_url": getattr(endpoint, "internal_endpoint", None),
        }
        return ServingHandle(name=name, backend="lepton", url=_url(dep), meta=meta)

    def _replicas(self, name: str, state: str) -> tuple[ReplicaStatus, ...]:
        """Each replica's readiness: the legacy API's readiness issues, else (the new Endpoint API has
        no readiness route) the replica list, healthy when the endpoint's state is Ready."""
        from leptonai.api.v2.endpoint import NewEndpointAPIUnsupported

        def readiness(api: Any) -> Any:
            try:
                return api.deployment.get_readiness(name)
            except NewEndpointAPIUnsupported:
                return _NO_READINESS

        issues = self.client.call(f"read readiness of '{name}'", readiness, missing_ok=True)
        if issues is _NO_READINESS:
            reps = self.client.call(
                f"list replicas of '{name}'", lambda api: api.deployment.get_replicas(name), missing_ok=True
            )
            health = ReplicaHealth.HEALTHY if state == "Ready" else ReplicaHealth.UNHEALTHY
            return tuple(
                ReplicaStatus(
                    index=i,
                    health=health,
                    external_id=rep.id_,
                    # a replica no node took is waiting for capacity (this API has no reason for it)
                    detail="" if state == "Ready" or (rep.status and rep.status.node) else _UNSCHEDULED,
                )
                for i, rep in enumerate(sorted(reps or [], key=lambda r: str(r.id_)))
            )
        out = []
        for i, (rid, items) in enumerate(sorted((getattr(issues, "root", None) or {}).items())):
            reasons = [(str(getattr(it.reason, "value", it.reason)), it.message) for it in items]
            ready = all(r == "Ready" for r, _ in reasons)
            detail = "" if ready else "; ".join(f"{r}: {m}" if m else r for r, m in reasons)
            out.append(
                ReplicaStatus(
                    index=i,
                    health=ReplicaHealth.HEALTHY if ready else ReplicaHealth.UNHEALTHY,
                    external_id=rid,
                    detail=detail,
                )
            )
        return tuple(out)

    def _key_refused(self, handle: ServingHandle, last: str) -> ReadinessError:
        """The endpoint is Ready but refuses the key the swarm's jobs will send."""
        b = self.backend
        status = last.removeprefix("Ready, but chat: ").split(":")[0]
        if b.endpoint_token_secret:
            what = (
                f"refuses the swarm's api_key ({status}), which its jobs send: the endpoint's token comes from "
                f"workspace secret '{b.endpoint_token_secret}' (backend.endpoint_token_secret), which must hold "
                "that same token"
            )
            hint = (
                f"put the api_key's token in secret '{b.endpoint_token_secret}' (or fix api_key), then `up` again; "
                "a secret changed after the endpoint started is read again only when its replicas restart."
            )
        else:
            what = f"refuses the swarm's api_key ({status}), which prefect-swarm set as its token"
            hint = "check the endpoint's access settings in the Lepton dashboard."
        return ReadinessError(f"Lepton deployment '{handle.name}' (workspace '{b.workspace_id}') {what}.", hint=hint)

    def _probe_chat(self, url: str | None) -> tuple[bool, str]:
        if not url:
            return False, "the deployment reports no endpoint URL yet"
        if self.cfg.api_key is None and self.backend.endpoint_token_secret:
            # The token lives only in a Lepton secret: the state plus replica readiness must do.
            return True, f"Ready (chat probe skipped: {self._unverified_token()})"
        key = self.cfg.api_key.get_secret_value() if self.cfg.api_key else None
        probe = check_answer(url, self.cfg.model_name, key, timeout_s=60.0)
        return probe.ok, "Ready; chat completion answered" if probe.ok else f"Ready, but chat: {probe.detail}"

    def _not_ready(self, handle: ServingHandle, what: str) -> ReadinessError:
        evidence = self._evidence(handle.name)
        return ReadinessError(
            f"Lepton deployment '{handle.name}' (workspace '{self.backend.workspace_id}') {what}.",
            stderr=evidence or None,
            hint=f"check the image ({self.backend.image}), the engine command and resource_shape "
            f"({self.backend.resource_shape}); `lep endpoint log -n {handle.name}` shows the replica logs.",
        )

    def _evidence(self, name: str) -> str:
        lines: list[str] = []
        try:
            events = self.client.call("read events", lambda api: api.deployment.get_events(name), missing_ok=True)
            lines += [f"event {e.type_} {e.reason} x{e.count}" for e in (events or [])[-10:]]
            reps = self.client.call("list replicas", lambda api: api.deployment.get_replicas(name), missing_ok=True)
            for rep in (reps or [])[:2]:
                text = (
                    self.client.call(
                        "read replica log",
                        lambda api, r: read_log(api.deployment.get_log(name, r, timeout=5)),
                        rep,
                    )
                    or ""
                )
                lines += [f"{rep.id_}: {ln}" for ln in text.splitlines()[-20:]]
        except (PrefectSwarmError, RuntimeError) as exc:
            lines.append(f"(could not read more evidence: {type(exc).__name__})")
        return "\n".join(lines)

    def _delete_jobs(self, name: str) -> None:
        jobs = self.client.call("list jobs", lambda api: api.job.list_all(query=f"{LABEL_OWNER}={self.owner}")) or []
        for job in jobs:
            labels = job.metadata.labels or {}
            if labels.get(LABEL_SWARM) == name and labels.get(LABEL_OWNER) == self.owner:
                jid = job.metadata.id_
                self.client.call(f"delete job '{jid}'", lambda api, j: api.job.delete(j), jid, missing_ok=True)

    def _wait_gone(self, name: str) -> bool:
        deadline = time.monotonic() + DELETE_WAIT_S
        while self._get(name) is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(1.0, self.backend.ready_poll_s))
        return True


def _check_secret_env(cfg: SwarmConfig) -> None:
    """``backend.secret_env`` (the endpoint's) and ``backend.job_secret_env`` (every job's) name
    usable env variables, none also set in plain env."""
    from leptonai.api.v2.spec_utils import validate_environment_variable_name

    b: LeptonConfig = cfg.backend  # type: ignore[assignment]
    for field, names, plain in (
        ("secret_env", b.secret_env, engine_env(cfg)),
        ("job_secret_env", b.job_secret_env, cfg.env),
    ):
        for name in names:
            try:
                validate_environment_variable_name(name)
            except ValueError as exc:
                raise ConfigError(f"backend.{field}: {name!r} cannot be used on Lepton: {exc}") from None
            if name in plain:
                raise ConfigError(f"backend.{field}: {name} is set in env / engine.env too; keep one.")


def _made_by(dep: Any) -> str:
    """Who made a deployment, as far as its marks tell."""
    owner = owner_mark(dep)
    if owner:
        return f"made by the prefect-swarm swarm '{owner}'"
    if (getattr(getattr(dep, "metadata", None), "labels", None) or {}).get(LABEL_SWARM):
        return "made by a prefect-swarm without owner marks"
    return "no prefect-swarm owner mark: made by hand or by another tool"


def _listable(shape: Any, purpose: str) -> bool:
    """True when ``shape`` may be used for ``purpose`` (its ``listable_in``; a shape without one is kept)."""
    listable = getattr(getattr(shape, "spec", None), "listable_in", None)
    return not listable or purpose.lower() in {str(x).lower() for x in listable}


def _shape_name(shape: Any) -> str:
    """A shape's name as the SDK's CLI shows it: ``spec.name``, else ``metadata.name``, else its id."""
    spec, meta = getattr(shape, "spec", None), getattr(shape, "metadata", None)
    return str(getattr(spec, "name", None) or getattr(meta, "name", None) or getattr(meta, "id_", None) or "")


def _json(spec: Any) -> str:
    return json.dumps(spec.model_dump(mode="json", by_alias=True, exclude_none=True), indent=2) + "\n"


def _state(dep: Any) -> str:
    state = getattr(getattr(dep, "status", None), "state", None)
    return str(getattr(state, "value", state) or "UNK")


def _phase(dep: Any) -> str | None:
    phase = getattr(getattr(dep, "status", None), "phase", None)
    return None if phase is None else str(getattr(phase, "value", phase))


def _url(dep: Any) -> str | None:
    endpoint = getattr(getattr(dep, "status", None), "endpoint", None)
    url = getattr(endpoint, "external_endpoint", None)
    return str(url).rstrip("/") if url else None


def _fatal(st: ServingStatus) -> bool:
    return any(r.detail.split(":")[0] in FATAL_REASONS for r in st.replicas)
