"""Processes this machine runs for us: a pid remembered with its start time, and stopping it safely.

A pid alone is not an identity: once a process is gone its pid can be handed to an unrelated one.
:class:`ProcRef` keeps psutil's ``create_time`` next to the pid, and every liveness check and
every signal goes through :meth:`ProcRef.process`, which returns the process only while both still
match. Stopping reaches the whole process group (vLLM forks engine workers) but never our own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from prefect_swarm.backends.common import start_logged
from prefect_swarm.sidecar.watchdog import CREATE_TIME_SLACK_S as _CREATE_TIME_SLACK_S

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""Processes started by this process, kept so their Popen objects are not collected while running."""


def spawn(argv: Sequence[str], env: Mapping[str, str], log: Path, cwd: Path | str | None = None) -> ProcRef:
    """:func:`start_logged`, kept as a child of this process; its identity-checked reference."""
    proc = start_logged(argv, env, log, cwd)
    _CHILDREN[proc.pid] = proc
    return ProcRef.of(proc.pid)


@dataclass(frozen=True)
class ProcRef:
    """A process we started: pid plus create time (identity check against pid reuse)."""

    pid: int
    create_time: float | None

    @classmethod
    def of(cls, pid: int) -> ProcRef:
        """Reference the process ``pid`` as it is now."""
        try:
            return cls(pid, float(psutil.Process(pid).create_time()))
        except psutil.Error:
            return cls(pid, None)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ProcRef | None:
        """From ``{"pid": .., "create_time": ..}``; None for missing or malformed data."""
        if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
            return None
        ct = data.get("create_time")
        return cls(int(data["pid"]), float(ct) if isinstance(ct, int | float) else None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {"pid": self.pid, "create_time": self.create_time}

    def process(self) -> psutil.Process | None:
        """The live process, or None when it is gone, a zombie, or a different process now."""
        if self.create_time is None:
            return None  # cannot prove identity: never touch it
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > _CREATE_TIME_SLACK_S:
                return None
        except psutil.Error:
            return None
        return proc if _running(proc) else None

    def alive(self) -> bool:
        """True while the very process we started is running."""
        return self.process() is not None


def _reap(pid: int) -> None:
    """Collect a zombie child of ours (no-op for anyone else's)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _signal(proc: psutil.Process, sig: int, group: bool) -> None:
    """Send ``sig`` to ``proc``'s process group when it leads one (and it is not ours), else to it."""
    try:
        pgid = os.getpgid(proc.pid)
        if group and pgid == proc.pid and pgid != os.getpgrp():
            os.killpg(pgid, sig)
        else:
            proc.send_signal(sig)
    except (ProcessLookupError, psutil.Error):
        pass


def stop(refs: Iterable[ProcRef | None], grace_s: float = 10.0, term_group: bool = True) -> list[int]:
    """Stop processes (with their groups and descendants): TERM, wait ``grace_s``, then KILL.

    ``term_group=False`` sends the TERM to each leader only (a wrapper that forwards it), the KILL
    still reaches the group. Unverifiable or already-gone references are skipped, so this is
    idempotent. Returns the pids that were still running when called.
    """
    leaders = [p for r in refs if r is not None and (p := r.process()) is not None]
    if not leaders:
        return []
    family = {p.pid: p for p in leaders}
    for p in leaders:
        with contextlib.suppress(psutil.Error):
            family.update({c.pid: c for c in p.children(recursive=True)})
    for p in leaders:
        _signal(p, signal.SIGTERM, term_group)
    alive = _wait_gone(list(family.values()), grace_s)
    for p in leaders:
        if _running(p):
            _signal(p, signal.SIGKILL, True)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    _wait_gone(alive, 5.0)
    return [p.pid for p in leaders]


def _running(proc: psutil.Process) -> bool:
    """Running and not a zombie (a zombie child of ours is reaped on the way)."""
    try:
        if not proc.is_running():
            return False
        if proc.status() == psutil.STATUS_ZOMBIE:
            _reap(proc.pid)
            return False
    except psutil.Error:
        return False
    return True


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process is gone or a zombie; return those still running at the timeout.

    psutil.wait_procs would wait out the whole timeout for a zombie whose parent is another process.
    """
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    return alive
