"""Holding a swarm: the one place that brings a swarm up for a holder, attaches to it, shares it,
releases it and tears down what an owner holds. Free of Prefect: the Prefect layer registers its word
on flow runs and where a block's secrets come from (:func:`register_prefect_word`), and
:func:`default_holding`, the one way to get a :class:`Holding`, uses what is registered.

Every user of a swarm holds a lease on it (:class:`~prefect_swarm.state.LeaseRecord`): a flow run,
a CLI process, a job, or the KEEP lease ``up`` leaves. The swarm stops when its last live holder
lets go; a holder that can no longer be asked (a flow run whose process is gone and that no
reachable Prefect API knows) counts as gone (:func:`dead_owners`). Stopping is
idempotent: a second stop while a first is under way waits for it and reports the swarm stopped.

The lease records and their constructors live beside the state they are stored in
(:mod:`prefect_swarm.state.leases`), the atomic claims in :class:`~prefect_swarm.state.StateStore`;
whether a holder is still there (:func:`dead_owners`), joining and letting go (:meth:`Holding.join`,
:meth:`Holding.release`) are here, and everything that holds or lets go of a swarm goes through
:class:`Holding`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError, ReadinessError, ShardStopped, StateError
from prefect_swarm.interfaces import JobHandle, JobStatus, ServingHandle, ServingPhase, ServingStatus
from prefect_swarm.interfaces.parking import Snapshot
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.state import (
    KEEP_OWNER,
    Claim,
    LeaseKind,
    LeaseRecord,
    StateStore,
    SwarmRecord,
    job_lease,
    keep_lease,
    process_lease,
    this_host,
)
from prefect_swarm.swarm import LIVE_PHASES, Swarm, engine_fingerprint, missing_secrets

log = logging.getLogger("prefect_swarm.holding")

SecretSource = Callable[[SwarmRecord], SwarmConfig | None]
"""Given a swarm's record whose secrets the environment lacks, the config they can come from (the
Prefect layer reloads the SwarmSpec block named by the record's ``source``), or None."""

Say = Callable[[str], None]
"""Where a holding step says what it did (a run's logger, the CLI's log)."""

STOP_WAIT_S = 300.0
"""Longest a stop waits for another stop of the same swarm that is under way."""

BRING_UP_GRACE_S = 30.0
"""A PENDING record with no handle and no bring-up lease older than this was left by a bring-up
that died before it could say so (or by a version without bring-up leases): it blocks nobody."""

TerminalRuns = Callable[[list[str]], dict[str, bool]]
"""Given flow run ids, whether each has ended, for the runs the Prefect API knows (the Prefect layer
asks it; may raise). A run it does not know, or every run when it cannot be asked, is absent."""


def _pid_alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_owners(
    leases: Iterable[LeaseRecord], store: StateStore, terminal_runs: TerminalRuns | None = None
) -> set[str]:
    """Owners whose leases are dead: a flow run ``terminal_runs`` says has ended; a flow run it cannot
    judge (no API to ask, or one that does not know the run: a temporary server that is gone) whose
    process is gone on this host; a process whose pid is gone on this host (a killed flow process
    that was tearing the swarm down must not block the teardown that follows it); once a lease has
    expired, a job no longer active or whose processes have all ended (:func:`_job_gone`). A KEEP
    lease, and anything that cannot be judged, count as live."""
    now, host = time.time(), this_host()
    dead: set[str] = set()
    runs: dict[str, LeaseRecord] = {}
    for lease in leases:
        if lease.kind is LeaseKind.FLOW_RUN:  # Prefect's word is final, expired or not
            runs[lease.owner.removeprefix("flow-run:")] = lease
            continue
        if lease.kind in (LeaseKind.PROCESS, LeaseKind.TEARDOWN, LeaseKind.BRING_UP):
            if lease.host == host and not _pid_alive(lease.pid):  # the process's own word, expired or not
                dead.add(lease.owner)
            continue
        if lease.expires_at is None or lease.expires_at > now:
            continue
        if lease.kind is LeaseKind.JOB and _job_gone(lease, store, now):
            dead.add(lease.owner)
    if runs:
        return dead | _dead_runs(runs, terminal_runs, host)
    return dead


def _dead_runs(runs: dict[str, LeaseRecord], terminal_runs: TerminalRuns | None, host: str) -> set[str]:
    """The owners of flow-run leases ``runs`` (by run id) that are dead: Prefect's word where it has
    one; where it has none, the run's process (gone on this host: the run cannot use the swarm)."""
    ended = terminal_runs(list(runs)) if terminal_runs is not None else {}
    dead = set()
    for run_id, lease in runs.items():
        said = ended.get(run_id)
        if said or (said is None and lease.host == host and not _pid_alive(lease.pid)):
            dead.add(lease.owner)
    return dead


JOB_SUBMIT_GRACE_S = 600.0
"""Seconds a job whose row still says PENDING (its submitter has not recorded a submission yet)
holds its lease before its processes are asked about."""


def _job_gone(lease: LeaseRecord, store: StateStore, now: float) -> bool:
    """A job lease's owner is gone: its row is missing or finished, or every process it submitted
    has ended by the compute backend's own probe (a detached ``job submit`` that nobody asked
    ``job status`` about since still holds an active row), or it has no submission
    JOB_SUBMIT_GRACE_S after the lease was taken. A job being submitted (PENDING, within the
    grace) and anything the backend cannot tell count as live."""
    job = store.get_job(lease.owner.removeprefix("job:"))
    if job is None or not job.status.active or _rows_all_answered(job.spec):
        return True
    if job.status is JobStatus.PENDING and now - lease.heartbeat < JOB_SUBMIT_GRACE_S:
        return False
    subs = job.submissions
    if not subs:  # never submitted: its submitter died before it could, once the grace is over
        return now - lease.heartbeat >= JOB_SUBMIT_GRACE_S
    if not job.swarm or store.get_swarm(job.swarm) is None:
        return False
    try:
        compute = Swarm.from_state(job.swarm, store).compute
        probes = [compute.probe(JobHandle.from_dict(sub)) for sub in subs]
    except Exception:  # cannot tell: live
        return False
    return all(p.error is None and p.status is not None and p.status.finished for p in probes)


def _rows_all_answered(spec: dict[str, Any]) -> bool:
    """Every shard of the batch job ``spec`` is done: it needs its swarm no more, even while its last
    process publishes the output (that is bookkeeping, no GPU). False when it cannot be told."""
    if "input" not in spec:
        return False
    try:
        from prefect_swarm.jobs.checkpoint.plan import pending_shards
        from prefect_swarm.jobs.spec import JobSpec

        return not pending_shards(JobSpec.model_validate(spec))
    except Exception:
        return False


class PrefectWord(Protocol):
    """What the Prefect layer tells holding (registered with :func:`register_prefect_word` when it is
    imported): its word on flow runs, and where a swarm's dropped secrets come from. Each call may be
    slow (it asks the Prefect API); neither raises but :meth:`terminal_runs` with ``strict``."""

    def terminal_runs(self, run_ids: list[str], *, strict: bool = False) -> dict[str, bool]:
        """Whether each of ``run_ids`` the API knows has ended (:data:`TerminalRuns`). When the API
        cannot be asked: none, or with ``strict`` PrefectUnavailable (the reaper then does nothing)."""
        ...

    def secrets(self, rec: SwarmRecord) -> SwarmConfig | None:
        """The :data:`SecretSource`: the config the recorded swarm ``rec`` came from, or None."""
        ...


_registered: list[PrefectWord] = []


def register_prefect_word(word: PrefectWord) -> None:
    """Make ``word`` the one every :func:`default_holding` uses from now on (the last registered wins)."""
    _registered[:] = [word]


def default_holding(store: StateStore | None = None, *, say: Say | None = None, strict: bool = False) -> Holding:
    """The :class:`Holding` of this process, the one way to get one: on ``store`` (the default state
    database), with the registered Prefect layer's word on flow runs (``strict``: a run Prefect cannot
    be asked about raises, see :meth:`PrefectWord.terminal_runs`) and its secrets source; without one
    (a job process, no Prefect imported) a flow run's lease is judged by its process and a record's
    secrets come from the environment and the swarm's folder. What it does goes to ``say``."""
    word = _registered[0] if _registered else None
    if word is None:
        return Holding(store or StateStore(), say=say)

    def terminal_runs(run_ids: list[str]) -> dict[str, bool]:
        return word.terminal_runs(run_ids, strict=strict)

    return Holding(store or StateStore(), terminal_runs=terminal_runs, secrets=word.secrets, say=say)


@dataclass(frozen=True)
class Held:
    """What :meth:`Holding.bring_up` got: the swarm, and whether this call started it (else it
    shares a live swarm; ``shared`` names it when it is another name's, of the same engine)."""

    swarm: Swarm
    started: bool
    shared: str | None = None
    ready: ServingStatus | None = None
    """What the wait saw (with ``wait``): fresher than a second look, which a watchdog may not have written yet."""
    restored: bool = False
    """This call brought the swarm back from its snapshot (it was parked)."""


@dataclass
class Holding:
    """Hold, share and release swarms in one state database.

    ``terminal_runs`` is Prefect's word on flow runs (without it a flow run's lease is judged by
    its process only); ``secrets`` reloads the secrets a record dropped; ``say`` receives what was
    done (reaped leases, a swarm that stays up and why).
    """

    store: StateStore = dataclasses.field(default_factory=StateStore)
    terminal_runs: TerminalRuns | None = None
    secrets: SecretSource | None = None
    say: Say | None = None

    # ------------------------------------------------------------------ attach
    def attach(self, name: str, *, secrets: SwarmConfig | None = None) -> Swarm:
        """The :class:`Swarm` of the recorded swarm ``name`` (the one way to get one from a record).

        The record holds no secrets: the environment's come first, else ``secrets``, else the
        source's (:data:`SecretSource`, asked only when the environment lacks some), else the API
        key ``up`` kept in the swarm's folder (:meth:`Swarm.from_state`)."""
        rec = self.store.require_swarm(name)
        if secrets is None and self.secrets is not None and rec.source and missing_secrets(rec.config):
            secrets = self.secrets(rec)
        return Swarm.from_state(name, self.store, secrets=secrets)

    def live(self, name: str) -> SwarmRecord | None:
        """The record of swarm ``name`` when it is live (pending, initializing or running)."""
        rec = self.store.get_swarm(name)
        return rec if rec is not None and rec.phase in LIVE_PHASES else None

    def reusable(self, cfg: SwarmConfig) -> SwarmRecord | None:
        """A live swarm serving ``cfg``'s engine on its backend that no flow run owns (kept, or
        brought up by the CLI): a run may share it instead of bringing up its own."""
        want = engine_fingerprint(cfg)
        for rec in self.store.list_swarms():
            if rec.phase not in LIVE_PHASES or rec.fingerprint != want or rec.backend != cfg.backend.type:
                continue
            if rec.keep or rec.flow_run_id is None:
                return rec
        return None

    # ------------------------------------------------------------------ hold
    def bring_up(
        self,
        swarm: Swarm,
        lease: LeaseRecord,
        *,
        reuse: bool = False,
        reconcile: bool = False,
        wait: bool = False,
        timeout_s: float | None = None,
        leave_on_failure: bool = False,
    ) -> Held:
        """Hold ``swarm`` with ``lease``: bring it up, or share it when it is live or being brought
        up (never twice); with ``reuse`` a live unowned swarm of the same engine under another name
        is shared instead; with ``reconcile`` a live swarm is reconciled with this config (``up``
        again); with ``wait``, wait until it is ready.

        On failure (other than bad input, refused before anything started) what this call started
        is torn down, unless ``leave_on_failure`` (``up --keep``: left for inspection); a swarm it
        only shares is left to its other holders, and this call's lease is dropped (not a KEEP
        lease: that one is everybody's ``up``)."""
        cfg = swarm.cfg
        self.settle_parked(cfg.name)
        found = self.reusable(cfg) if reuse else None
        if found is not None and found.name != cfg.name:
            self._adopt_unleased(found)
            self.store.put_lease(dataclasses.replace(lease, swarm=found.name))
            return Held(self.attach(found.name, secrets=cfg), started=False, shared=found.name)
        before = self.live(cfg.name)
        if before is not None:
            self._adopt_unleased(before)
        was = self.store.get_swarm(cfg.name)
        parked = was is not None and was.phase is ServingPhase.PARKED
        started: bool | None = None
        ready = None
        try:
            started = self.join(swarm, lease, reconcile=reconcile)
            if wait:
                ready = swarm.wait_ready(timeout_s)
        except ConfigError:
            raise
        except BaseException:
            ours = before is None and started is not False
            self._after_failed_bring_up(swarm, lease, ours=ours, leave=leave_on_failure)
            raise
        return Held(swarm, started=bool(started), ready=ready, restored=bool(started) and parked)

    def _after_failed_bring_up(self, swarm: Swarm, lease: LeaseRecord, *, ours: bool, leave: bool) -> None:
        name = swarm.cfg.name
        if ours and leave:
            log.warning("bring-up of '%s' failed; leaving it as it is. `prefect-swarm down %s` stops it.", name, name)
            return
        try:
            if ours:
                log.warning("bring-up of '%s' failed; tearing down what started", name)
                swarm.down()
            elif lease.kind is not LeaseKind.KEEP:
                self.release(name, lease.owner)
        except Exception as exc:  # the bring-up error matters more; say the teardown also failed
            log.error("teardown of '%s' failed too: %s. Run `prefect-swarm down %s`.", name, exc, name)

    def _adopt_unleased(self, rec: SwarmRecord) -> None:
        """A live swarm with no lease at all was brought up before leases existed (or by hand):
        give it the KEEP lease its keep flag / lack of owner meant, so a sharer does not stop it."""
        if (rec.keep or rec.flow_run_id is None) and not self.store.list_leases(rec.name):
            self.store.put_lease(keep_lease(rec.name))

    def join(
        self,
        swarm: Swarm,
        lease: LeaseRecord,
        *,
        wait_s: float | None = None,
        poll_s: float = 0.5,
        reconcile: bool = False,
    ) -> bool:
        """Hold ``swarm`` with ``lease``; bring it up if it is not live (True), else wait until
        whoever is bringing it up has started it and attach (False). Never brings it up twice.
        With ``reconcile`` an attached swarm is also reconciled with this config (``prefect-swarm up``
        again: missing replicas are replaced, a new replica count is applied; healthy ones stay).

        A swarm being stopped is waited for, then brought up again. Raise ConfigError if the
        live swarm of this name serves another engine, ReadinessError after ``wait_s``. A bring-up
        that failed, or whose process died (on this host), blocks nobody: its record is FAILED.
        """
        swarm.validate()
        deadline = time.monotonic() + (wait_s if wait_s is not None else swarm.cfg.ready_timeout_s + 60)
        parked = swarm.store.get_swarm(swarm.cfg.name)
        if parked is not None and parked.phase is ServingPhase.PARKED and parked.keep:
            swarm.keep = True  # a kept swarm woken by a holder stays kept
        while True:
            claim, rec = swarm.store.claim_swarm(swarm.new_record(ServingPhase.PENDING, None), lease, LIVE_PHASES)
            if claim is Claim.BRING_UP:
                try:
                    swarm.up()
                except BaseException:
                    swarm.store.release_lease(swarm.cfg.name, lease.owner)  # a failed bring-up holds nothing
                    raise
                return True
            if claim is Claim.ATTACH and rec is not None and swarm.flow_run_id and rec.flow_run_id == swarm.flow_run_id:
                swarm.up()  # this run's own earlier attempt (a task retry): reconcile it
                return True
            if claim is Claim.ATTACH and rec is not None:
                if rec.fingerprint != swarm.fingerprint or rec.backend != swarm.cfg.backend.type:
                    swarm.store.release_lease(rec.name, lease.owner)
                    raise ConfigError(
                        f"swarm '{rec.name}' is live with a different model/engine/backend "
                        f"(fingerprint {rec.fingerprint}). `prefect-swarm down {rec.name}` first, or pick another name."
                    )
                got = self._wait_started(swarm, deadline, poll_s)
                if got is not None:
                    swarm.handle = ServingHandle.from_dict(got.handle or {})
                    swarm.flow_run_id, swarm.keep, swarm.source = got.flow_run_id, got.keep, got.source
                    if reconcile:
                        swarm.handle = swarm.backends.serving.create_or_update(swarm.cfg)
                        swarm.store.update_swarm(
                            swarm.cfg.name, handle=swarm.handle.to_dict(), config=swarm.cfg.redacted()
                        )
                    return False
                swarm.store.release_lease(swarm.cfg.name, lease.owner)  # it failed: claim again
            if time.monotonic() > deadline:
                raise ReadinessError(
                    f"swarm '{swarm.cfg.name}': gave up waiting for another user to bring it up or down.",
                    hint=f"`prefect-swarm status {swarm.cfg.name}` shows who holds it; "
                    f"`prefect-swarm down {swarm.cfg.name}` stops it.",
                )
            time.sleep(poll_s)

    def _wait_started(self, swarm: Swarm, deadline: float, poll_s: float) -> SwarmRecord | None:
        """The record once its bringer has a handle; None if it failed or was stopped meanwhile."""
        while True:
            rec = swarm.store.get_swarm(swarm.cfg.name)
            if rec is None or rec.phase not in LIVE_PHASES:
                return None
            if rec.handle and rec.phase is not ServingPhase.PENDING:
                return rec
            bringers = [x for x in swarm.store.list_leases(swarm.cfg.name) if x.kind is LeaseKind.BRING_UP]
            if self._bring_up_died(swarm, rec, bringers):
                swarm.store.update_swarm(swarm.cfg.name, phase=ServingPhase.FAILED)
                for x in bringers:
                    swarm.store.release_lease(swarm.cfg.name, x.owner)
                return None
            if time.monotonic() > deadline:
                who = ", ".join(f"{x.owner} (pid {x.pid} on {x.host})" for x in bringers) or "nobody known"
                raise ReadinessError(
                    f"swarm '{swarm.cfg.name}' is still being brought up by {who}; gave up waiting.",
                    hint=f"wait for it, or `prefect-swarm down {swarm.cfg.name}` to stop that bring-up.",
                )
            time.sleep(poll_s)

    def _bring_up_died(self, swarm: Swarm, rec: SwarmRecord, bringers: list[LeaseRecord]) -> bool:
        """The PENDING record ``rec`` (no handle) belongs to a bring-up that is gone: every bring-up
        lease is dead (its pid is gone on this host), or there is none and the record is older than
        BRING_UP_GRACE_S (the bringer died between its claim and its lease)."""
        if bringers:
            return dead_owners(bringers, swarm.store) >= {x.owner for x in bringers}
        return time.time() - rec.updated_at > BRING_UP_GRACE_S

    def hold(self, name: str, lease: LeaseRecord) -> None:
        """Add ``lease`` as a holder of the live swarm ``name`` (a run using a swarm it did not bring up)."""
        rec = self.store.require_swarm(name)
        if rec.phase in LIVE_PHASES:
            self._adopt_unleased(rec)
        self.store.put_lease(dataclasses.replace(lease, swarm=name))

    def hold_if_same(self, cfg: SwarmConfig, lease: LeaseRecord) -> bool:
        """Hold swarm ``cfg.name`` with ``lease`` when it is live with the same config (engine
        fingerprint, backend and replica count; its holder's stop then leaves it up for this one);
        return whether it is held now. A run queued behind an exclusive swarm's holder takes it over
        so; a swarm of another config is left alone (its holder stops it, the queued run brings up
        its own)."""
        rec = self.live(cfg.name)
        if rec is None or rec.fingerprint != engine_fingerprint(cfg) or rec.backend != cfg.backend.type:
            return False
        if int(rec.config.get("replicas") or 0) != cfg.replicas:
            return False
        if not self.holds(cfg.name, lease.owner):
            self.hold(cfg.name, lease)
        return True

    def keep(self, name: str, owner: str) -> None:
        """Turn ``owner``'s hold on ``name`` into the KEEP hold: the swarm stays up until ``down``."""
        self.store.put_lease(keep_lease(name))
        self.store.update_swarm(name, keep=True)
        self.store.release_lease(name, owner)

    @contextmanager
    def job_hold(self, name: str, job_id: str, running: Callable[[], bool]) -> Iterator[LeaseRecord]:
        """Hold swarm ``name`` for job ``job_id`` while its processes are being submitted and after
        (until the job is no longer active, see :func:`dead_owners`). A
        submission refused or interrupted with nothing ``running`` drops the hold."""
        lease = self.store.put_lease(job_lease(name, job_id))
        try:
            yield lease
        except BaseException:
            if not running():
                self.store.release_lease(name, lease.owner)
            raise

    # ------------------------------------------------------------------ park
    def park(self, name: str, reason: str) -> Snapshot:
        """Park swarm ``name`` (:meth:`Swarm.park`): every GPU given back, its holders keep their holds."""
        return self.attach(name).park(reason)

    def restore(self, name: str, *, wait: bool = True, timeout_s: float | None = None) -> Held:
        """Bring the parked swarm ``name`` back from its snapshot (one restore however many ask: the
        claim of :meth:`join`); with ``wait``, until it is ready. A live swarm is only attached.
        This call holds it while it restores; it stays up for the holds it had (KEEP, runs, jobs)."""
        self.settle_parked(name)
        rec = self.store.require_swarm(name)
        if rec.phase not in LIVE_PHASES and rec.phase is not ServingPhase.PARKED:
            raise StateError(
                f"swarm '{name}' is {rec.phase.value}, not parked: nothing to restore. "
                "`prefect-swarm up -c CONFIG` brings it up."
            )
        swarm = self.attach(name)
        lease = dataclasses.replace(process_lease(owner=f"restore:{this_host()}:{os.getpid()}"), swarm=name)
        try:
            return self.bring_up(swarm, lease, wait=wait, timeout_s=timeout_s)
        finally:
            self.store.release_lease(name, lease.owner)

    def parked(self, name: str) -> bool:
        """Whether swarm ``name`` is parked, being parked or being restored: recorded PARKED, or live with
        its snapshot kept (written before its replicas stop, removed once it is ready again)."""
        rec = self.store.get_swarm(name)
        if rec is None:
            return False
        return rec.phase is ServingPhase.PARKED or (rec.phase in LIVE_PHASES and _snapshot_file(rec).exists())

    def wait_restored(
        self, name: str, *, poll_s: float = 1.0, say: Say | None = None, stop: threading.Event | None = None
    ) -> Swarm:
        """A job's pause on a parked swarm: wait, however long it stays parked, until it has been restored
        and is RUNNING again; return it. StateError when it is stopped meanwhile (nothing to wait for);
        ShardStopped when ``stop`` is set first (the run waiting is ending: a cancel still ends it)."""
        if say is not None:
            say(f"swarm '{name}' is parked: waiting for its restore (`prefect-swarm restore {name}`).")
        while True:
            rec = self.store.require_swarm(name)
            if rec.phase is ServingPhase.RUNNING and not self.parked(name):
                return self.attach(name)
            if rec.phase in (ServingPhase.STOPPED, ServingPhase.FAILED):
                raise StateError(
                    f"swarm '{name}' was {rec.phase.value.lower()} while parked; its job waits no more. "
                    f"`prefect-swarm up -c CONFIG` brings it up; resubmitting the job with its --id resumes it."
                )
            if stop is None:
                time.sleep(poll_s)
            elif stop.wait(poll_s):
                raise ShardStopped(f"swarm '{name}' is parked and the run waiting for its restore is ending")

    def settle_parked(self, name: str) -> None:
        """Record PARKED for a RUNNING swarm that parked itself (Slurm's LB past ``idle_timeout_s``):
        its snapshot is there and nothing of it runs. The next claim then restores it."""
        rec = self.store.get_swarm(name)
        if rec is None or rec.phase is not ServingPhase.RUNNING or not rec.handle:
            return
        if not _snapshot_file(rec).exists():
            return
        swarm = self.attach(name)
        if swarm.status().phase is ServingPhase.PARKED:
            self.store.settle_phase(rec, ServingPhase.PARKED)  # unless a holder claimed it meanwhile

    # ------------------------------------------------------------------ let go
    def holders(self, name: str) -> list[LeaseRecord]:
        """The leases on swarm ``name`` now."""
        return self.store.list_leases(name)

    def holds(self, name: str, owner: str) -> bool:
        """Whether ``owner`` holds swarm ``name``."""
        return any(x.owner == owner for x in self.store.list_leases(name))

    def gone(self, leases: list[LeaseRecord]) -> set[str]:
        """The owners among ``leases`` that are gone (:func:`dead_owners`)."""
        return dead_owners(leases, self.store, self.terminal_runs)

    def orphans(self) -> list[tuple[SwarmRecord, list[LeaseRecord]]]:
        """Live swarms that may have outlived their users, with their leases: no KEEP hold and no
        stop under way; or, without any lease, not kept and brought up by a flow run (recorded
        before leases existed). Whether their holders are gone is :meth:`gone`'s to say."""
        out = []
        for rec in self.store.list_swarms():
            if rec.phase not in LIVE_PHASES:
                continue
            leases = self.store.list_leases(rec.name)
            unheld = not any(x.kind in (LeaseKind.KEEP, LeaseKind.TEARDOWN) for x in leases)
            if unheld if leases else rec.flow_run_id and not rec.keep:
                out.append((rec, leases))
        return out

    def held_by(self, owner: str) -> list[str]:
        """The swarms ``owner`` holds."""
        return [x.swarm for x in self.store.leases_of(owner)]

    def release(self, name: str, owner: str | None, *, wait_s: float = STOP_WAIT_S) -> list[LeaseRecord]:
        """Drop ``owner``'s hold on swarm ``name`` (and the holds of owners that are gone); stop the
        swarm when no live holder is left. Return the leases still holding it ([]: it is stopped).

        Idempotent: when all that is left is another stop under way, wait for it (up to
        ``wait_s``) and report the swarm stopped."""
        swarm = self.attach(name)
        left = self._let_go(swarm, owner)
        deadline = time.monotonic() + wait_s
        while left and all(x.kind is LeaseKind.TEARDOWN for x in left):
            time.sleep(0.2)
            if self._stopped(name):
                return []
            if time.monotonic() > deadline:
                raise StateError(
                    f"swarm '{name}' is being stopped by {', '.join(x.owner for x in left)}; gave up waiting after "
                    f"{wait_s:g} s. `prefect-swarm status {name}` shows it; `prefect-swarm down {name} -y` again."
                )
            left = self._let_go(swarm, None)  # reaps a stopper that died
        return left

    def _let_go(self, swarm: Swarm, owner: str | None) -> list[LeaseRecord]:
        """Drop ``owner``'s lease (and those of dead owners); stop the swarm when no live lease is
        left. Return the leases still holding it ([] = stopped)."""
        name = swarm.cfg.name
        others = [x for x in swarm.store.list_leases(name) if x.owner != owner]
        dead = dead_owners(others, swarm.store, self.terminal_runs)
        for who in sorted(dead):
            if self.say:
                self.say(f"swarm '{name}': lease of {who} reaped (its owner is gone).")
        left = swarm.store.release_and_claim_teardown(name, owner, dead, process_lease(LeaseKind.TEARDOWN))
        if left:
            if self.say:
                self.say(f"swarm '{name}' stays up: still held by {', '.join(x.owner for x in left)}.")
            return left
        swarm.down()
        return []

    def _stopped(self, name: str) -> bool:
        rec = self.store.get_swarm(name)
        return rec is None or (rec.phase is ServingPhase.STOPPED and not self.store.list_leases(name))

    def release_keep(self, name: str) -> list[LeaseRecord]:
        """``down``: drop the KEEP hold (``up``'s) and stop the swarm when no live holder is left."""
        return self.release(name, KEEP_OWNER)

    def stop(self, name: str) -> list[str]:
        """Stop swarm ``name`` whatever holds it (``down --force``, a budget reached); return who held it."""
        holders = [x.owner for x in self.store.list_leases(name)]
        self.attach(name).down()
        return holders

    def teardown_owner(self, owner: str, flow_run_id: str | None = None, *, include_kept: bool = False) -> list[str]:
        """Let go of everything ``owner`` holds: each swarm is stopped when it was the last holder.
        With ``flow_run_id``, also stop the live swarms that run brought up and nobody holds
        (recorded before leases existed), unless kept (``include_kept`` stops those too).
        Idempotent. Return the names of the swarms stopped."""
        stopped = []
        for lease in self.store.leases_of(owner):
            if self.store.get_swarm(lease.swarm) is None:
                self.store.release_lease(lease.swarm, owner)
                continue
            if not self.release(lease.swarm, owner):
                stopped.append(lease.swarm)
        for rec in self.store.find_swarms_by_flow_run(flow_run_id) if flow_run_id else []:
            if rec.phase in LIVE_PHASES and (include_kept or not rec.keep) and not self.store.list_leases(rec.name):
                self.attach(rec.name).down()
                stopped.append(rec.name)
        return stopped


def _snapshot_file(rec: SwarmRecord) -> Path:
    """Where the snapshot of the recorded swarm ``rec`` is kept (its folder, by its recorded config)."""
    return SwarmPaths.of(rec.name, (rec.config.get("backend") or {}).get("run_dir")).parked
