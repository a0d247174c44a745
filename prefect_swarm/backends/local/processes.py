"""Processes this machine runs for us: started with an identity-checked reference, stopped safely.

Every liveness check and every signal goes through :meth:`ProcRef.process`
(:mod:`prefect_swarm.sidecar.procref`), which returns the process only while it is the one that was
started. Stopping reaches the whole process group (vLLM forks engine workers) but never our own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import psutil

from prefect_swarm.backends.common import start_logged
from prefect_swarm.sidecar.procref import ProcRef, running

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""Processes started by this process, kept so their Popen objects are not collected while running."""


def spawn(argv: Sequence[str], env: Mapping[str, str], log: Path, cwd: Path | str | None = None) -> ProcRef:
    """:func:`start_logged`, kept as a child of this process; its identity-checked reference."""
    proc = start_logged(argv, env, log, cwd)
    _CHILDREN[proc.pid] = proc
    return ProcRef.of(proc.pid)


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
        if running(p):
            _signal(p, signal.SIGKILL, True)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    _wait_gone(alive, 5.0)
    return [p.pid for p in leaders]


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process is gone or a zombie; return those still running at the timeout.

    psutil.wait_procs would wait out the whole timeout for a zombie whose parent is another process.
    """
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if running(p)]
    return alive
