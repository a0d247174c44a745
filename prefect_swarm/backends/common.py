"""Small pieces more than one backend uses, written once: head files, logged processes, log following.

* a head file holds ``host:port`` of a process once it serves (Slurm replicas and LB);
  :func:`head_url` turns it into a base URL;
* :func:`start_logged` starts a process in its own session with its output appended to a log;
* :class:`LogFollower` prints what log files gained since the last look (``wait(stream_logs=True)``);
* :func:`tail_file` yields a log file, and with ``follow`` what it gains (``prefect-swarm logs -f``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from prefect_swarm.paths import open_log, read_text


def host_port(text: str) -> tuple[str, int] | None:
    """Parse a head file's ``host:port``; None when malformed."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host, int(port)


def head_url(path: Path) -> str | None:
    """``http://host:port`` from a head file; None while it is missing or malformed."""
    text = read_text(path)
    parsed = host_port(text) if text else None
    return f"http://{parsed[0]}:{parsed[1]}" if parsed else None


def start_logged(
    argv: Sequence[str], env: Mapping[str, str], log: Path, cwd: Path | str | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (so stopping it reaches its group), stdout+stderr appended to ``log``."""
    with open_log(log) as out:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
        )


class LogFollower:
    """Prints the lines log files gained since the last call, each prefixed with its label."""

    def __init__(self, logs: Callable[[], Iterable[tuple[str, Path]]]) -> None:
        self.logs = logs
        self.offsets: dict[Path, int] = {}

    def __call__(self, finished: bool = False) -> None:
        """Print what is new (``finished`` changes nothing: files are read to their end each time)."""
        for label, path in self.logs():
            try:
                with path.open("rb") as fh:
                    fh.seek(self.offsets.get(path, 0))
                    data = fh.read()
                    self.offsets[path] = fh.tell()
            except OSError:
                continue
            for line in data.decode("utf-8", "replace").splitlines():
                sys.stdout.write(f"[{label}] {line}\n")
            sys.stdout.flush()


def tail_file(path: Path, *, follow: bool, alive: Callable[[], bool], poll_s: float = 0.5) -> Iterator[str]:
    """``path``'s text; with ``follow`` then what it gains, until ``alive()`` says the writer is gone
    (asked only when nothing new came; what it wrote before going is still yielded)."""
    offset = 0
    while True:
        running = alive() if follow else False
        try:
            with path.open("rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError:
            data = b""
        if data:
            offset += len(data)
            yield data.decode("utf-8", "replace")
        if not running:
            return
        if not data:
            time.sleep(poll_s)


__all__ = ["LogFollower", "head_url", "host_port", "start_logged", "tail_file"]
