"""The replica watchdog: runs one engine process, health-checks it, restarts it, reports on it.

    python -m prefect_swarm.sidecar.watchdog --spec <swarm>/watchdog-<i>.json

(The batch scripts' port helpers are :mod:`prefect_swarm.sidecar.ports`.)

* The replica runs in its own process group (so stopping it reaches vLLM's worker processes),
  with stdout+stderr appended to ``replica-<i>.log``.
* Every ``health_interval_s`` it GETs ``url + health_path``. Before the first healthy answer the
  replica is starting (health Unknown) and only ``startup_timeout_s`` limits it; once it has been
  healthy, ``UNHEALTHY_CHECKS`` failures in a row (outside the ``startup_grace_s`` after a start)
  restart it.
* An exit or an unhealthy replica is restarted after ``restart_backoff_s * 2**n`` seconds (capped
  at 60 s) until ``max_restarts`` restarts are spent; then the status says ``failed`` with the
  log tail, and the watchdog exits 1.
* After ``wall_time_s`` the replica is stopped and the watchdog exits 0, so a swarm whose flow
  died cannot run forever.
* With ``budget`` set (the swarm's ``backend.cost`` with a cap, local backend), every watchdog holds
  the swarm to it while the swarm runs, job or no job: the swarm's GPU-hours are its backend's figure
  (:func:`~prefect_swarm.config.cost.held_gpu_hours` over the live watchdogs of the swarm, from their
  pid records), checked by :class:`~prefect_swarm.budget.BudgetGuard` (a warning in this log at
  80 %). Past the cap the watchdog records why in ``SwarmPaths.stopped`` and stops; every other
  watchdog of the swarm stops on that file, and ``status`` shows the reason (phase STOPPED).
* SIGTERM/SIGINT/SIGHUP/SIGUSR1 stop the replica's process group (TERM, then KILL after
  ``stop_grace_s``) and exit: a ``scancel --signal=USR1 --full`` leaves no engine behind.
* With ``peers_file`` set (a replica spanning several nodes), a PID listed there that is gone stops
  the replica and the watchdog exits 1 without a restart and without marking it ``failed``: the
  Slurm reconciler resubmits the task, a new allocation of whole nodes.
* With ``port_token`` set (Slurm), every start picks the port: ``preferred_port`` when it is free,
  else one the kernel hands out, substituted for the token in ``argv`` and ``url`` and published as
  ``port`` in the status file. A health answer counts only while no process outside the replica's
  own process tree listens on that port (:func:`~prefect_swarm.sidecar.ports.port_owner_ok`), so a
  server of another swarm or user that holds the port is never taken for this replica.

The status file (``SwarmPaths.replica_status(i)``) is rewritten atomically at every change and
every check. The spec file holds no secrets: the API key reaches the replica through the
environment the watchdog inherits.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_swarm.exceptions import BudgetReached
from prefect_swarm.interfaces.jobenv import API_KEY, env_value
from prefect_swarm.interfaces.readiness import ProbeResult, check_health
from prefect_swarm.interfaces.types import ReplicaHealth
from prefect_swarm.paths import SwarmPaths, atomic_write_json, open_log, private_umask, read_json, read_tail
from prefect_swarm.redaction import redact, secret_values
from prefect_swarm.sidecar.ports import pick_port, port_owner_ok
from prefect_swarm.sidecar.procref import ProcRef

if TYPE_CHECKING:
    from prefect_swarm.budget import BudgetGuard

log = logging.getLogger("prefect_swarm.watchdog")

UNHEALTHY_CHECKS = 3
"""Failed health checks in a row, after a replica was healthy, that trigger a restart."""

MAX_BACKOFF_S = 60.0
BUDGET_CHECK_S = 1.0
"""How often a watchdog reads the swarm's GPU-hours for its budget (pid records and process start times)."""
LOG_TAIL_LINES = 40
TICK_S = 0.1
PORT_CHECK_S = 30.0
"""How often a healthy replica's port is checked for a foreign owner (see ``Watchdog._foreign_port``)."""


LOG_DRAIN_S = 2.0
"""How long the watchdog waits for an exited engine's last output to reach its log."""


def copy_redacted(stream: io.BufferedReader, log_file: Path, secrets: list[str]) -> None:
    """Append the engine's output ``stream`` to ``log_file`` through
    :func:`prefect_swarm.redaction.redact` (its key, tokens, request query strings: an access log
    keeps no secret), until the engine closes it. What one read brings is redacted and written at
    once, whole lines only (a line is never cut where a secret could straddle the cut)."""
    rest = b""
    with stream, open_log(log_file) as out:
        while chunk := stream.read1(1 << 16):  # what the pipe holds now, at most one read
            lines, _, rest = (rest + chunk).rpartition(b"\n")
            if lines:
                out.write(redact((lines + b"\n").decode("utf-8", "replace"), secrets).encode())
                out.flush()
        if rest:  # the last words of an engine that ended without a newline
            out.write(redact(rest.decode("utf-8", "replace"), secrets).encode())


@dataclass(frozen=True)
class WatchdogSpec:
    """Everything the watchdog of one replica needs (JSON in ``watchdog-<i>.json``; no secrets)."""

    swarm: str
    root: str
    index: int
    argv: list[str]
    url: str
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    health_interval_s: float = 2.0
    startup_grace_s: float = 5.0
    startup_timeout_s: float = 900.0
    max_restarts: int = 3
    restart_backoff_s: float = 2.0
    wall_time_s: float | None = None
    stop_grace_s: float = 10.0
    port_token: str | None = None
    preferred_port: int | None = None
    port_range: list[int] | None = None
    """[low, high]: the ports a start may pick (``backend.port_range``); None: any free port."""
    peers_file: str | None = None
    """Multi-node replica: a file of PIDs (one a line), the steps that run the replica's other nodes
    (Ray workers or engine ranks). When one is gone the replica stops at once, without a restart: it
    is replaced as one unit."""
    budget: dict[str, Any] | None = None
    """The swarm's ``backend.cost`` when it has a cap (local backend): the watchdogs hold the swarm to it."""
    gpus: int = 0
    """GPUs of one replica (``gpus_per_replica``): the swarm's GPU-hours are counted at this many per replica."""

    @property
    def paths(self) -> SwarmPaths:
        """Files of the swarm this replica belongs to."""
        return SwarmPaths(Path(self.root))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WatchdogSpec:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


class Watchdog:
    """Supervises one replica according to a :class:`WatchdogSpec`."""

    def __init__(self, spec: WatchdogSpec) -> None:
        self.spec = spec
        self.paths = spec.paths
        self.proc: subprocess.Popen[bytes] | None = None
        self.copier: threading.Thread | None = None
        self.restarts = 0
        self.last_exit_code: int | None = None
        self.started_at = 0.0
        self.healthy = ReplicaHealth.UNKNOWN
        self.ever_healthy = False
        self.up_this_start = False
        self.port_checked_at = 0.0
        self.bad_checks = 0
        self.detail = "starting"
        self.failed = False
        self.stopped = False
        self.tail = ""
        self.stop_requested: str | None = None
        self.born = time.time()
        self.ref = ProcRef.of(os.getpid())
        self.proc_ref: ProcRef | None = None
        self.port: int | None = spec.preferred_port if spec.port_token is None else None
        self.argv, self.url = spec.argv, spec.url
        self.next_swarm_check = 0.0
        self.guard = self._swarm_guard() if spec.budget else None

    def _swarm_guard(self) -> BudgetGuard:
        """The swarm's budget check (``backend.cost``); its pydantic models are imported only here, so a
        watchdog without a budget starts without them (every replica start pays for its imports)."""
        from prefect_swarm.budget import BudgetGuard
        from prefect_swarm.config.cost import CostConfig

        budget = CostConfig.model_validate(self.spec.budget)
        return BudgetGuard(self.spec.swarm, budget, self.swarm_usage, every_s=BUDGET_CHECK_S)

    # ------------------------------------------------------------------ status
    def write_status(self) -> None:
        """Rewrite the status file atomically."""
        pid = self.proc.pid if self.proc and self.proc.poll() is None else None
        atomic_write_json(
            self.paths.replica_status(self.spec.index),
            {
                "index": self.spec.index,
                "url": self.url,
                "port": self.port,
                "health": self.healthy.value,
                "pid": pid,
                "pid_create_time": self.proc_ref.create_time if pid and self.proc_ref else None,
                "pid_boot_time": self.proc_ref.boot_time if pid and self.proc_ref else None,
                "watchdog_pid": os.getpid(),
                "watchdog_create_time": self.ref.create_time,
                "restarts": self.restarts,
                "last_exit_code": self.last_exit_code,
                "started_at": self.started_at or None,
                "updated_at": time.time(),
                "ever_healthy": self.ever_healthy,
                "failed": self.failed,
                "stopped": self.stopped,
                "detail": self.detail,
                "log_tail": self.tail,
            },
        )

    # ------------------------------------------------------------------ replica process
    def start(self) -> None:
        """Start the replica in its own process group, output appended to its log."""
        logf = self.paths.replica_log(self.spec.index)
        token = self.spec.port_token
        if token:
            host = self.spec.url.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
            self.port = pick_port(host, self.spec.preferred_port, self.spec.port_range)
            self.argv = [a.replace(token, str(self.port)) for a in self.spec.argv]
            self.url = self.spec.url.replace(token, str(self.port))
        with open_log(logf) as out:
            out.write(f"\n--- prefect-swarm watchdog: start #{self.restarts} at {time.ctime()} ---\n".encode())
        env = {**os.environ, **self.spec.env}
        self.proc = subprocess.Popen(
            self.argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.copier = threading.Thread(
            target=copy_redacted, args=(self.proc.stdout, logf, secret_values(env)), daemon=True, name="engine-log"
        )
        self.copier.start()
        self.started_at = time.time()
        self.proc_ref = ProcRef.of(self.proc.pid)
        self.healthy, self.bad_checks, self.detail = ReplicaHealth.UNKNOWN, 0, "starting"
        self.up_this_start = False
        log.info("replica %d started: pid %d at %s", self.spec.index, self.proc.pid, self.url)
        self.write_status()

    def stop_replica(self) -> None:
        """TERM the replica's process group, KILL it after ``stop_grace_s``."""
        proc = self.proc
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(self.spec.stop_grace_s)
            except subprocess.TimeoutExpired:
                continue
            # the leader is gone; sweep what is left of its group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            break
        self.last_exit_code = proc.poll()

    # ------------------------------------------------------------------ supervision
    def check(self) -> bool:
        """One health check; returns False when the replica must be restarted. Logs changes of the
        replica's health, never each probe (one line per state, not one per ``health_interval_s``)."""
        before = self.healthy
        ok = self._check()
        if self.healthy is not before:
            log.info("replica %d: %s -> %s (%s)", self.spec.index, before.value, self.healthy.value, self.detail)
        return ok

    def _check(self) -> bool:
        now = time.time()
        since = now - self.started_at
        timeout = min(5.0, max(1.0, self.spec.health_interval_s))
        probe = check_health(self.url, self.spec.health_path, timeout_s=timeout, api_key=env_value(API_KEY))
        if probe.ok and self._foreign_port():
            probe = ProbeResult(False, f"port {self.port} is held by a process that is not this replica")
        if probe.ok:
            self.healthy, self.bad_checks = ReplicaHealth.HEALTHY, 0
            self.ever_healthy = self.up_this_start = True
            self.detail = "healthy"
            return True
        if not self.up_this_start or since < self.spec.startup_grace_s:
            self.detail = f"starting ({since:.0f}s): {probe.detail}"
            if since > self.spec.startup_timeout_s:
                self.detail = f"not healthy after startup_timeout_s={self.spec.startup_timeout_s:g}: {probe.detail}"
                return False
            return True
        self.bad_checks += 1
        self.healthy = ReplicaHealth.UNHEALTHY
        self.detail = f"unhealthy ({self.bad_checks}/{UNHEALTHY_CHECKS}): {probe.detail}"
        return self.bad_checks < UNHEALTHY_CHECKS

    def _foreign_port(self) -> bool:
        """True when the port this replica picked is held by a process outside its tree. Checked at
        every probe until the replica answers healthy in this start, then every ``PORT_CHECK_S``: the
        check reads every process's sockets (~20 ms of CPU), and while the engine holds the port no
        one else can bind it (when its process exits, the watchdog restarts it at once)."""
        if not self.spec.port_token or self.proc is None or not self.port:
            return False
        now = time.monotonic()
        if self.up_this_start and now < self.port_checked_at + PORT_CHECK_S:
            return False
        self.port_checked_at = now
        return not port_owner_ok(self.proc.pid, self.port)

    def handle_failure(self, why: str) -> bool:
        """Stop the replica, then schedule a restart or give up. Returns False once failed."""
        self.stop_replica()
        self.healthy = ReplicaHealth.UNHEALTHY
        self.tail = read_tail(self.paths.replica_log(self.spec.index), LOG_TAIL_LINES)
        log.warning("replica %d: %s (restarts so far: %d)", self.spec.index, why, self.restarts)
        if self.restarts >= self.spec.max_restarts:
            self.failed = True
            self.detail = f"failed: {why}; gave up after {self.restarts} restarts (max_restarts)"
            self.write_status()
            return False
        delay = min(self.spec.restart_backoff_s * 2**self.restarts, MAX_BACKOFF_S)
        self.detail = f"{why}; restarting in {delay:g}s"
        self.write_status()
        if self.sleep(delay):
            self.restarts += 1
            self.start()
        return True

    def sleep(self, seconds: float) -> bool:
        """Sleep in short ticks; False as soon as a stop was requested."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.stop_requested:
                return False
            time.sleep(min(TICK_S, max(0.0, end - time.monotonic())))
        return not self.stop_requested

    def wall_time_left(self) -> float:
        """Seconds before the wall-time limit (inf without one)."""
        if self.spec.wall_time_s is None:
            return float("inf")
        return self.born + self.spec.wall_time_s - time.time()

    def lost_peer(self) -> str | None:
        """Why the replica lost one of its other nodes (a ``peers_file`` PID is gone), or None."""
        if not self.spec.peers_file:
            return None
        try:
            pids = [int(word) for word in Path(self.spec.peers_file).read_text().split()]
        except (OSError, ValueError):
            return None
        for rank, pid in enumerate(pids, start=1):
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                state = "gone"
            if state in ("gone", "Z", "X"):
                return f"node rank {rank} was lost (its step, pid {pid}, ended)"
        return None

    def swarm_usage(self) -> tuple[float, None]:
        """The swarm's GPU-hours as its local backend counts them (``gpu_usage``): every live watchdog
        of the swarm since it started, at ``gpus`` GPUs each (their pid records; shape: none)."""
        from prefect_swarm.config.cost import held_gpu_hours

        starts, i = [], 0
        while self.paths.watchdog_pid(i).exists() or self.paths.replica_status(i).exists():
            starts.append(live_since(read_json(self.paths.watchdog_pid(i))))
            i += 1
        return held_gpu_hours(starts, self.spec.gpus), None

    def swarm_stop(self) -> str | None:
        """Why the whole swarm stops now: another watchdog found it past its budget (``paths.stopped``,
        written since this one started), or this one does (it then writes that file for the others and
        for ``status``); None to go on."""
        if self.guard is None or time.monotonic() < self.next_swarm_check:
            return None
        self.next_swarm_check = time.monotonic() + BUDGET_CHECK_S  # not every tick: once a check period
        found = read_json(self.paths.stopped) or {}
        if found.get("reason") and float(found.get("at") or 0) >= self.born:
            return str(found["reason"])
        try:
            self.guard.check()
        except BudgetReached as exc:
            reason = f"{exc}: the swarm's watchdogs stopped it (backend.cost)"
            atomic_write_json(self.paths.stopped, {"at": time.time(), "reason": reason})
            log.warning("replica %d: %s", self.spec.index, reason)
            return reason
        return None

    def step(self) -> bool:
        """One supervision step; False when the watchdog should stop supervising."""
        assert self.proc is not None
        lost = self.lost_peer()
        if lost:
            # Not ``failed`` (that marks an engine a resubmission would not fix): the LB's reconciler
            # resubmits the task, a new allocation of whole nodes.
            self.stop_replica()
            self.healthy = ReplicaHealth.UNHEALTHY
            self.detail = f"{lost}; a replica spanning several nodes is replaced as one unit"
            log.warning("replica %d: %s", self.spec.index, self.detail)
            self.write_status()
            return False
        rc = self.proc.poll()
        if rc is not None:
            self.last_exit_code = rc
            if self.copier is not None:  # its last lines are the reason: in the log before it is read
                self.copier.join(LOG_DRAIN_S)
            return self.handle_failure(f"exited with code {rc}")
        if not self.check():
            return self.handle_failure(self.detail)
        self.write_status()
        return True

    def run(self) -> int:
        """Supervise until stopped, out of wall time, or failed; returns the watchdog's exit code."""
        self.start()
        code = 0
        while not self.stop_requested:
            if self.wall_time_left() <= 0:
                self.stop_requested = f"wall time of {self.spec.wall_time_s:g}s reached"
                break
            why = self.swarm_stop()
            if why:
                self.stop_requested = why
                break
            if not self.step():
                code = 0 if self.stop_requested else 1
                break
            # Poll faster until the first healthy answer so `status` turns Healthy soon after readiness.
            interval = self.spec.health_interval_s if self.healthy is ReplicaHealth.HEALTHY else 0.5
            self.sleep(min(interval, max(self.wall_time_left(), 0.0)))
        if self.stop_requested:
            self.shutdown(self.stop_requested)
        return code

    def shutdown(self, why: str) -> None:
        """Stop the replica and record why."""
        log.info("replica %d: stopping (%s)", self.spec.index, why)
        self.stop_replica()
        self.stopped, self.healthy, self.detail = True, ReplicaHealth.UNKNOWN, f"stopped: {why}"
        self.write_status()

    def request_stop(self, signum: int, _frame: object) -> None:
        """Signal handler: remember the stop; the loop acts on it."""
        self.stop_requested = f"signal {signal.Signals(signum).name}"


def live_since(record: Any) -> float | None:
    """The create time in a pid record (:class:`ProcRef` as a dict) while that very process runs, else None."""
    ref = ProcRef.from_dict(record)
    return ref.create_time if ref is not None and ref.alive() else None


def mark_failed(status_file: Path, reason: str) -> None:
    """Write a ``failed`` status for a replica whose engine never started (its job's ``setup`` failed):
    like a watchdog that gave up, it is not resubmitted, and ``up`` reports ``reason``."""
    atomic_write_json(
        status_file,
        {
            "health": ReplicaHealth.UNHEALTHY.value,
            "restarts": 0,
            "updated_at": time.time(),
            "ever_healthy": False,
            "failed": True,
            "stopped": False,
            "detail": reason,
            "log_tail": "",
        },
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the watchdog of the spec file given by ``--spec``."""
    ap = argparse.ArgumentParser(description="Run and supervise one engine replica.")
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--spec", type=Path, help="watchdog-<i>.json written by the backend")
    group.add_argument(
        "--mark-failed",
        nargs=2,
        type=str,
        metavar=("STATUS_FILE", "REASON"),
        help="write a failed status (a replica that never started: its job's setup failed)",
    )
    args = ap.parse_args(argv)
    if args.mark_failed:
        mark_failed(Path(args.mark_failed[0]), args.mark_failed[1])
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for quiet in ("httpx", "httpcore"):  # one INFO line per health probe otherwise (~30 a minute)
        logging.getLogger(quiet).setLevel(logging.WARNING)
    data = read_json(args.spec)
    if not isinstance(data, dict):
        log.error("cannot read watchdog spec %s", args.spec)
        return 2
    dog = Watchdog(WatchdogSpec.from_dict(data))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, dog.request_stop)
    return dog.run()


if __name__ == "__main__":
    private_umask()  # the process entry point only: a test calling main() keeps its umask
    sys.exit(main())
