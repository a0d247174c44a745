"""A process we started, named so that any later look (another process, another day) finds that very
process or nothing.

A pid alone is not an identity: once a process is gone, its pid can be handed to an unrelated one.
:class:`ProcRef` keeps the process's start next to its pid. psutil gives that start as a wall-clock
time: the start since boot (which never changes) plus the boot time the kernel reports now, and
that boot time moves with every step of the wall clock (an NTP step, a VM resumed from a
snapshot). So a reference also keeps the boot time its start was read with, and a later look
compares the start since boot: a step of the clock neither loses a live process (a running job's
shard is not "vanished", a replica's watchdog is not started twice) nor lends its identity to
another. A record without a boot time (written before it was kept) is compared on the wall clock.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import psutil

SLACK_S = 0.05
"""Two looks at one process agree on its start since boot this closely (the kernel counts in 10 ms ticks)."""


def _start(proc: psutil.Process) -> tuple[float, float]:
    """(create time, the boot time it was computed with) of ``proc``: the boot time is read before
    and after, and the pair kept once no step of the clock fell between them."""
    for _ in range(3):
        boot = psutil.boot_time()
        created = float(proc.create_time())
        if psutil.boot_time() == boot:
            break
    return created, boot


@dataclass(frozen=True)
class ProcRef:
    """A process we started: pid plus its start (an identity check against pid reuse)."""

    pid: int
    create_time: float | None
    """psutil's create time (seconds since the epoch) when the reference was taken; None: unknown."""
    boot_time: float | None = None
    """The boot time ``create_time`` was computed with; None in records that predate it."""

    @classmethod
    def of(cls, pid: int) -> ProcRef:
        """Reference the process ``pid`` as it is now (``create_time`` None when it is already gone)."""
        try:
            return cls(pid, *_start(psutil.Process(pid)))
        except psutil.Error:
            return cls(pid, None)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ProcRef | None:
        """From ``{"pid", "create_time", "boot_time"}``; None for missing or malformed data."""
        if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
            return None
        ct, bt = data.get("create_time"), data.get("boot_time")
        return cls(
            int(data["pid"]),
            float(ct) if isinstance(ct, int | float) else None,
            float(bt) if isinstance(bt, int | float) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {"pid": self.pid, "create_time": self.create_time, "boot_time": self.boot_time}

    def process(self) -> psutil.Process | None:
        """The live process, or None when it is gone, a zombie, or a different process now."""
        if self.create_time is None:
            return None  # cannot prove identity: never touch it
        try:
            proc = psutil.Process(self.pid)
            created, boot = _start(proc)
        except psutil.Error:
            return None
        if self.boot_time is None:
            same = abs(created - self.create_time) <= SLACK_S
        else:
            same = abs((created - boot) - (self.create_time - self.boot_time)) <= SLACK_S
        return proc if same and running(proc) else None

    def alive(self) -> bool:
        """True while the very process we started is running."""
        return self.process() is not None


def running(proc: psutil.Process) -> bool:
    """Running and not a zombie (a zombie child of ours is reaped on the way)."""
    try:
        if not proc.is_running():
            return False
        if proc.status() == psutil.STATUS_ZOMBIE:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(proc.pid, os.WNOHANG)  # a no-op for anyone else's
            return False
    except psutil.Error:
        return False
    return True
