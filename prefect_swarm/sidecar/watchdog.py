"""The replica watchdog: runs one engine process, health-checks it, restarts it, reports on it.

    python -m prefect_swarm.sidecar.watchdog --spec <swarm>/watchdog-<i>.json

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
* SIGTERM/SIGINT stop the replica's process group (TERM, then KILL after ``stop_grace_s``) and exit.

The status file (``SwarmPaths.replica_status(i)``) is rewritten atomically at every change and
every check. The spec file holds no secrets: the API key reaches the replica through the
environment the watchdog inherits.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefect_swarm.interfaces.readiness import check_health
from prefect_swarm.interfaces.types import ReplicaHealth
from prefect_swarm.paths import SwarmPaths, atomic_write_json, read_json, read_tail

log = logging.getLogger("prefect_swarm.watchdog")

UNHEALTHY_CHECKS = 3
"""Failed health checks in a row, after a replica was healthy, that trigger a restart."""

MAX_BACKOFF_S = 60.0
LOG_TAIL_LINES = 40
TICK_S = 0.1


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


def process_create_time(pid: int) -> float | None:
    """psutil's create time of ``pid`` (identity check against pid reuse), or None if gone."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


class Watchdog:
    """Supervises one replica according to a :class:`WatchdogSpec`."""

    def __init__(self, spec: WatchdogSpec) -> None:
        self.spec = spec
        self.paths = spec.paths
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.last_exit_code: int | None = None
        self.started_at = 0.0
        self.healthy = ReplicaHealth.UNKNOWN
        self.ever_healthy = False
        self.up_this_start = False
        self.bad_checks = 0
        self.detail = "starting"
        self.failed = False
        self.stopped = False
        self.tail = ""
        self.stop_requested: str | None = None
        self.born = time.time()

    # ------------------------------------------------------------------ status
    def write_status(self) -> None:
        """Rewrite the status file atomically."""
        pid = self.proc.pid if self.proc and self.proc.poll() is None else None
        atomic_write_json(
            self.paths.replica_status(self.spec.index),
            {
                "index": self.spec.index,
                "url": self.spec.url,
                "health": self.healthy.value,
                "pid": pid,
                "pid_create_time": process_create_time(pid) if pid else None,
                "watchdog_pid": os.getpid(),
                "watchdog_create_time": process_create_time(os.getpid()),
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
        with logf.open("ab") as out:
            out.write(f"\n--- prefect-swarm watchdog: start #{self.restarts} at {time.ctime()} ---\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.spec.argv,
                env={**os.environ, **self.spec.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started_at = time.time()
        self.healthy, self.bad_checks, self.detail = ReplicaHealth.UNKNOWN, 0, "starting"
        self.up_this_start = False
        log.info("replica %d started: pid %d", self.spec.index, self.proc.pid)
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
        """One health check; returns False when the replica must be restarted."""
        now = time.time()
        since = now - self.started_at
        timeout = min(5.0, max(1.0, self.spec.health_interval_s))
        probe = check_health(self.spec.url, self.spec.health_path, timeout_s=timeout)
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

    def step(self) -> bool:
        """One supervision step; False when the watchdog should stop supervising."""
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is not None:
            self.last_exit_code = rc
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


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the watchdog of the spec file given by ``--spec``."""
    ap = argparse.ArgumentParser(description="Run and supervise one engine replica.")
    ap.add_argument("--spec", required=True, type=Path, help="watchdog-<i>.json written by the backend")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    data = read_json(args.spec)
    if not isinstance(data, dict):
        log.error("cannot read watchdog spec %s", args.spec)
        return 2
    dog = Watchdog(WatchdogSpec.from_dict(data))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, dog.request_stop)
    return dog.run()


if __name__ == "__main__":
    sys.exit(main())
