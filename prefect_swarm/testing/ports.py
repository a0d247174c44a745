"""Free loopback ports for tests that start engines or fake APIs (e.g. a stub swarm's ``port:``)."""

from __future__ import annotations

import os
import random
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host``."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_start() -> int:
    """Where the kernel starts handing out ports to outgoing connections (Linux default 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_slice(start: int, end: int) -> tuple[int, int]:
    """Under ``pytest -n N`` (pytest-xdist), worker ``gwK``'s own K-th of N equal parts of start..end:
    the workers' tests run at once, and two of them could otherwise pick the same free block and
    both try to bind it (a swarm's port is checked here, then bound seconds later by its engine)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return start, end
    size = (end - start) // int(count)
    low = start + int(worker[2:]) % int(count) * size
    return low, low + size


def free_port_block(n: int, host: str = "127.0.0.1", start: int | None = None, end: int | None = None) -> int:
    """A base port such that base..base+n-1 are all free now (a local swarm's replicas use base+i),
    from ``start``..``end`` when given.

    By default picked from 20000 up to the kernel's ephemeral range, so an outgoing connection cannot
    take the port between this check and the engine's bind; under pytest-xdist each worker picks
    from a part of that range of its own (:func:`_worker_slice`).
    """
    low, high = 20000 if start is None else start, _ephemeral_start() if end is None else end
    if start is None and end is None:
        low, high = _worker_slice(low, high)
    for _ in range(200):
        base = random.randrange(low, high - n)
        if all(_is_free(host, base + i) for i in range(n)):
            return base
    raise RuntimeError(f"no block of {n} free ports found between {low} and {high} on {host}")


def _is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
