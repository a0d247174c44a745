"""Stage a model directory on node-local disk once: ``python -m prefect_swarm.sidecar.stage --from SRC --to DEST``.

Run on the node before the engine starts (the Slurm replica script runs it on every node of a replica;
the local backend calls :func:`stage` before it starts the replicas). ``DEST`` is the staged folder
itself (``SwarmConfig.staged_model``); the command prints it on stdout when it holds a copy of ``SRC``.

* The copy is keyed by a content hash: a manifest of every file of ``SRC`` (relative path, size,
  mtime in ns; symlinks followed, as in a Hugging Face snapshot), then sha256 of the manifest.
* ``DEST/.prefect-swarm-stage.json`` (:data:`MARKER`) records the hash; when it matches and every
  file is there with its size, nothing is copied ("already staged (hash ...), skipped").
* Otherwise the files are copied into ``.<name>.tmp-<pid>`` next to ``DEST`` and renamed into place,
  so a half copy is never used; a copy left by a killed stager is removed by the next one.
* Concurrent stagers of one ``DEST`` on a node (replicas of one or several swarms) take an exclusive
  lock (``.<name>.lock``): one copies, the others wait and then skip.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect_swarm.exceptions import StageError
from prefect_swarm.paths import atomic_write_json, file_lock, private_umask, read_json

MARKER = ".prefect-swarm-stage.json"
"""The marker file in a staged folder: source, hash, file count, bytes, when and how long."""

log = logging.getLogger("prefect_swarm.stage")


@dataclass(frozen=True)
class Manifest:
    """Every file of a source folder: relative path -> (size, mtime_ns)."""

    files: dict[str, tuple[int, int]]

    @property
    def digest(self) -> str:
        """sha256 of the manifest text (one ``path<TAB>size<TAB>mtime_ns`` line per file, sorted)."""
        text = "".join(f"{p}\t{s}\t{m}\n" for p, (s, m) in sorted(self.files.items()))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def total_bytes(self) -> int:
        """Sum of the file sizes."""
        return sum(s for s, _ in self.files.values())


def manifest(source: Path) -> Manifest:
    """The manifest of ``source`` (a folder; symlinks followed)."""
    if not source.is_dir():
        raise StageError(f"stage.from '{source}' is not a directory on {socket.gethostname()}: nothing to copy.")
    files: dict[str, tuple[int, int]] = {}
    for top, dirs, names in os.walk(source, followlinks=True):
        dirs.sort()
        for name in names:
            path = Path(top, name)
            st = path.stat()
            files[path.relative_to(source).as_posix()] = (st.st_size, st.st_mtime_ns)
    return Manifest(files)


def read_marker(dest: Path) -> dict[str, Any] | None:
    """The marker of a staged folder, or None."""
    data = read_json(dest / MARKER)
    return data if isinstance(data, dict) else None


def _matches(dest: Path, want: Manifest) -> bool:
    marker = read_marker(dest)
    if not marker or marker.get("hash") != want.digest:
        return False
    for rel, (size, _) in want.files.items():
        try:
            if (dest / rel).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def lock_path(dest: Path) -> Path:
    """The lock file stagers of ``dest`` take (next to it, on the same disk)."""
    return dest.parent / f".{dest.name}.lock"


def stage(source: Path, dest: Path) -> Path:
    """Make ``dest`` a copy of ``source`` unless it already is one (see the module doc); returns ``dest``."""
    source, dest = Path(source), Path(dest)
    want = manifest(source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with file_lock(lock_path(dest)):
        waited = time.monotonic() - started
        if _matches(dest, want):
            log.info(
                "already staged (hash %s) at %s, skipped (waited %.2f s for the lock)", want.digest[:12], dest, waited
            )
            return dest
        for leftover in dest.parent.glob(f".{dest.name}.tmp-*"):  # a killed stager's half copy
            shutil.rmtree(leftover, ignore_errors=True)
        t0 = time.monotonic()
        tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
        try:
            # shutil.copy: content and mode, not the source's mtime (a staged file's mtime is when it was staged)
            shutil.copytree(source, tmp, symlinks=False, copy_function=shutil.copy)
            seconds = time.monotonic() - t0
            atomic_write_json(
                tmp / MARKER,
                {
                    "source": str(source),
                    "hash": want.digest,
                    "files": len(want.files),
                    "bytes": want.total_bytes,
                    "staged_at": time.time(),
                    "seconds": round(seconds, 3),
                    "host": socket.gethostname(),
                },
            )
            old = dest.parent / f".{dest.name}.tmp-old-{os.getpid()}"
            if dest.exists():
                dest.rename(old)
            tmp.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StageError(f"staging {source} to {dest} on {socket.gethostname()} failed: {exc}") from exc
        log.info(
            "staged %d files (%.1f MB, hash %s) to %s in %.2f s",
            len(want.files),
            want.total_bytes / 1e6,
            want.digest[:12],
            dest,
            seconds,
        )
        return dest


def staged_copies(root: Path) -> list[dict[str, Any]]:
    """The staged folders directly under ``root`` (those with a marker), with their marker fields."""
    out = []
    if root.is_dir():
        for child in sorted(root.iterdir()):
            marker = read_marker(child) if child.is_dir() and not child.name.startswith(".") else None
            if marker:
                out.append({"path": str(child), **marker})
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: stage, print the staged path; exit 1 (with the reason on stderr) on failure."""
    ap = argparse.ArgumentParser(prog="python -m prefect_swarm.sidecar.stage", description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="source", help="model directory to copy")
    ap.add_argument("--to", dest="dest", help="the staged folder on this node")
    ap.add_argument("--list", dest="root", help="print the staged copies under this folder (JSON) and exit")
    args = ap.parse_args(argv)
    if args.root:
        print(json.dumps({"host": socket.gethostname(), "copies": staged_copies(Path(args.root))}))
        return 0
    if not (args.source and args.dest):
        ap.error("--from and --to are both needed (or --list DIR)")
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s stage[{socket.gethostname()}] %(message)s", stream=sys.stderr
    )
    try:
        path = stage(Path(args.source), Path(args.dest))
    except StageError as exc:
        print(f"stage: {exc}", file=sys.stderr)
        return 1
    print(path, flush=True)
    return 0


if __name__ == "__main__":
    private_umask()  # the process entry point only: a test calling main() keeps its umask
    sys.exit(main())
