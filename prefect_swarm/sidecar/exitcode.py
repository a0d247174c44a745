"""Run a command and record how it ended, so a process that is not its parent can learn the exit code.

    python -m prefect_swarm.sidecar.exitcode --out shard-00000.exit.json [--after LOG] -- CMD ARG...

The wrapper stays the command's parent, forwards SIGTERM/SIGINT/SIGHUP/SIGUSR1/SIGUSR2 to it
(so signal the wrapper, not its process group, or the command gets each signal twice), waits for it, writes
``{"exit_code": N, "signal": NAME|null, "finished_at": T}`` atomically to ``--out``, and exits with
the same code (``128 + signal`` when the command was killed by a signal). A missing file after the
wrapper is gone means it was killed itself (SIGKILL): the outcome is unknown.

``--after LOG`` starts the command once ``LOG`` (an earlier process's log) is not empty, or after
``--after-s`` seconds (default :data:`AFTER_S`) whatever it holds: processes started on one machine
at once then do not all load their modules together, and the first of them reaches its work sooner
(a job's shards on the local backend: see :mod:`prefect_swarm.backends.local.compute`). A signal
that comes during that wait ends the wrapper without starting the command: exit 75 (EX_TEMPFAIL:
nothing was done, run it again).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

from prefect_swarm.paths import atomic_write_json

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
AFTER_S = 5.0
"""Most seconds ``--after`` waits for the earlier process's log."""
NOT_STARTED = 75
"""Exit code of a wrapper signalled before it started its command (EX_TEMPFAIL)."""


def wait_for(log: Path, most_s: float) -> int | None:
    """Wait until ``log`` is not empty, at most ``most_s`` seconds; the signal that came meanwhile, if any."""
    came: list[int] = []

    def note(signum: int, _frame: object) -> None:
        came.append(signum)

    old = {sig: signal.signal(sig, note) for sig in FORWARDED}
    try:
        deadline = time.monotonic() + most_s
        while not came and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if log.stat().st_size > 0:
                    break
            time.sleep(0.02)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return came[0] if came else None


def run(command: list[str], out: Path) -> int:
    """Run ``command``, write its outcome to ``out``; return the code this wrapper should exit with."""
    try:
        proc = subprocess.Popen(command)
    except OSError as exc:
        atomic_write_json(
            out,
            {
                "exit_code": 127,
                "signal": None,
                "finished_at": time.time(),
                "error": f"{type(exc).__name__}: {exc}",
            },
        )
        print(f"prefect-swarm: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            rc = proc.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for safety
            continue
    name = signal.Signals(-rc).name if rc < 0 else None
    atomic_write_json(out, {"exit_code": rc, "signal": name, "finished_at": time.time()})
    return 128 - rc if rc < 0 else rc


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description="Run a command and record its exit status in a file.")
    ap.add_argument("--out", required=True, type=Path, help="JSON file written when the command ends")
    ap.add_argument("--after", type=Path, default=None, help="start once this log file is not empty")
    ap.add_argument("--after-s", type=float, default=AFTER_S, help="... or after this many seconds")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARG...")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given after --")
    if args.after is not None:
        signum = wait_for(args.after, args.after_s)
        if signum is not None:
            name = signal.Signals(signum).name
            atomic_write_json(args.out, {"exit_code": NOT_STARTED, "signal": None, "finished_at": time.time()})
            print(f"prefect-swarm: {name} before {command[0]!r} was started: not started", file=sys.stderr)
            return NOT_STARTED
    return run(command, args.out)


if __name__ == "__main__":
    sys.exit(main())
