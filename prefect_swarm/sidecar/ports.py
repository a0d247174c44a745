"""Port helpers of the batch scripts, kept free of the package's heavier imports (pydantic, httpx,
pyarrow): a script calls them once per start, and on a cluster every import is read from a shared
filesystem, so each one is paid on the critical path of ``up``.

    python -m prefect_swarm.sidecar.ports --pick-port HOST PORT [--port-range LOW-HIGH]
                                          # PORT if free on HOST (and in the range), else a free one
    python -m prefect_swarm.sidecar.ports --await-listen PID PORT  # 0 once PID's tree listens on PORT

The replica watchdog (:mod:`prefect_swarm.sidecar.watchdog`) picks its engine's port and checks who
holds it with the same functions.
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import time
from collections.abc import Sequence


def pick_port(host: str, preferred: int | None, port_range: Sequence[int] | None = None) -> int:
    """``preferred`` when it can be bound on ``host`` now (and lies in ``port_range``), else a free
    port of ``port_range`` (tried from a random place, so replicas starting together spread out),
    else (no range) one the kernel picks. OSError when none is free."""
    low, high = port_range or (0, 0)
    wanted = [preferred] if preferred and (not port_range or low <= preferred <= high) else []
    if port_range:
        start = random.randrange(high - low + 1)
        wanted += [low + (start + k) % (high - low + 1) for k in range(high - low + 1)]
    for port in wanted if port_range else [*wanted, 0]:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError(f"no free port on {host}" + (f" in {low}-{high} (backend.port_range)" if port_range else ""))


def process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants now (empty when it is gone)."""
    import psutil

    try:
        return {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}
    except psutil.Error:
        return set()


def await_listen(pid: int, port: int, timeout_s: float = 15.0) -> bool:
    """True once ``pid`` (or a descendant) listens on ``port``; False when it died, or did not in time."""
    import psutil

    end = time.monotonic() + timeout_s
    while time.monotonic() < end and psutil.pid_exists(pid):
        listeners = psutil.net_connections(kind="tcp")
        owners = {c.pid for c in listeners if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
        if owners & process_tree(pid):
            return True
        time.sleep(0.2)
    return False


def port_owner_ok(pid: int, port: int) -> bool:
    """False when a process outside ``pid``'s tree (or one we may not see) listens on ``port``.

    True when the listener is ``pid`` or one of its descendants, or when no listener is visible at
    all on this host (an engine in another network namespace): then the health answer decides.
    """
    import psutil

    try:
        listeners = [c for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        return True
    owners = {c.pid for c in listeners if c.laddr and c.laddr.port == port}
    return not owners or owners <= process_tree(pid)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``--pick-port`` prints a port; ``--await-listen`` exits 0 once the PID listens."""
    ap = argparse.ArgumentParser(description="Port helpers of the batch scripts.")
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--pick-port", nargs=2, metavar=("HOST", "PORT"), help="print PORT if it is free on HOST, else a free port"
    )
    ap.add_argument("--port-range", default=None, metavar="LOW-HIGH", help="with --pick-port: pick from these")
    group.add_argument(
        "--await-listen", nargs=2, type=int, metavar=("PID", "PORT"), help="exit 0 once PID listens on PORT, else 1"
    )
    args = ap.parse_args(argv)
    if args.pick_port:
        span = [int(p) for p in args.port_range.split("-")] if args.port_range else None
        print(pick_port(args.pick_port[0], int(args.pick_port[1]), span))
        return 0
    return 0 if await_listen(*args.await_listen) else 1


if __name__ == "__main__":
    sys.exit(main())
