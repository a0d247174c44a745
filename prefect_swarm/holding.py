"""Holding a swarm: the one place that brings a swarm up for a holder, attaches to it, shares it,
releases it and tears down what an owner holds. Free of Prefect (the Prefect layer passes in its
word on flow runs and where a block's secrets come from).

Every user of a swarm holds a lease on it (:class:`~prefect_swarm.state.LeaseRecord`): a flow run,
a CLI process, a job, or the KEEP lease ``up`` leaves. The swarm stops when its last live holder
lets go; a holder that can no longer be asked (a flow run whose process is gone and that no
reachable Prefect API knows) counts as gone (:func:`~prefect_swarm.swarm.dead_owners`). Stopping is
idempotent: a second stop while a first is under way waits for it and reports the swarm stopped.

The lease primitives (the records, the atomic claims, :meth:`Swarm.join` and :meth:`Swarm.release`)
live in :mod:`prefect_swarm.swarm` and :mod:`prefect_swarm.state`; everything that holds or lets go
of a swarm goes through :class:`Holding`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError, ShardStopped, StateError
from prefect_swarm.interfaces import ServingPhase, ServingStatus
from prefect_swarm.interfaces.parking import Snapshot
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.state import LeaseKind, LeaseRecord, StateStore, SwarmRecord
from prefect_swarm.swarm import (
    KEEP_OWNER,
    LIVE_PHASES,
    Swarm,
    TerminalRuns,
    dead_owners,
    engine_fingerprint,
    job_lease,
    keep_lease,
    missing_secrets,
    process_lease,
    this_host,
)

log = logging.getLogger("prefect_swarm.holding")

SecretSource = Callable[[SwarmRecord], SwarmConfig | None]
"""Given a swarm's record whose secrets the environment lacks, the config they can come from (the
Prefect layer reloads the SwarmSpec block named by the record's ``source``), or None."""

Say = Callable[[str], None]
"""Where a holding step says what it did (a run's logger, the CLI's log)."""

STOP_WAIT_S = 300.0
"""Longest a stop waits for another stop of the same swarm that is under way."""


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
            started = swarm.join(lease, reconcile=reconcile)
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
        (until the job is no longer active, see :func:`~prefect_swarm.swarm.dead_owners`). A
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
        claim of :meth:`Swarm.join`); with ``wait``, until it is ready. A live swarm is only attached.
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
        """The owners among ``leases`` that are gone (:func:`~prefect_swarm.swarm.dead_owners`)."""
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
        left = swarm.release(owner, terminal_runs=self.terminal_runs, log=self.say)
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
            left = swarm.release(None, terminal_runs=self.terminal_runs, log=self.say)  # reaps a stopper that died
        return left

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
