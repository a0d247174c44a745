"""Free loopback ports for tests that start engines or fake APIs (e.g. a stub swarm's ``port:``)."""

from __future__ import annotations

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


def free_port_block(n: int, host: str = "127.0.0.1", start: int = 20000, end: int | None = None) -> int:
    """A base port such that base..base+n-1 are all free now (a local swarm's replicas use base+i).

    Picked below the kernel's ephemeral range by default, so an outgoing connection cannot take
    the port between this check and the engine's bind.
    """
    end = end if end is not None else _ephemeral_start()
    for _ in range(200):
        base = random.randrange(start, end - n)
        if all(_is_free(host, base + i) for i in range(n)):
            return base
    raise RuntimeError(f"no block of {n} free ports found between {start} and {end} on {host}")


def _is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
