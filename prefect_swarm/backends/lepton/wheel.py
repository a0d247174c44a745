"""This prefect-swarm as a wheel, staged on the workspace's shared storage for job images without it.

A Lepton job runs in the image the user names (by default the endpoint's ``vllm/vllm-openai``),
which has no prefect-swarm. With ``backend.job_wheel`` (the default) ``up`` builds a wheel of the
prefect-swarm this process runs (its installed files, whatever way it was installed: no build tool,
no network) and writes it once per version and content under ``<shared_path>/.wheels/``; each job's
setup installs it with the image's ``pip`` when the job interpreter cannot import this version
(its dependencies come from the image or the package index, as ``pip install`` finds them).

The wheel is built deterministically (sorted entries, fixed times), so the same tree gives the
same file, the same folder, and ``up`` writes nothing when it is there already.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import os
import shlex
import zipfile
from importlib import metadata
from pathlib import Path

import prefect_swarm
from prefect_swarm import __version__
from prefect_swarm.paths import atomic_write_bytes

WHEELS_DIR = ".wheels"
"""Folder under ``backend.shared_path`` holding the staged wheels (one folder per version and content)."""
DIST = "prefect_swarm"
INSTALL_FAILED = "prefect-swarm setup: pip could not install"
"""What a job's setup prints when the staged wheel cannot be installed in its image."""
_EPOCH = (1980, 1, 1, 0, 0, 0)


@functools.cache
def wheel_bytes() -> tuple[str, bytes]:
    """(file name, bytes) of this prefect-swarm as a pure-Python wheel: its package files (no
    bytecode) and a dist-info with its own METADATA and entry points. Built once per process."""
    root = Path(prefect_swarm.__file__).parent
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo") and ".tmp" not in p.name
    )
    info = f"{DIST}-{__version__}.dist-info"
    try:
        dist = metadata.distribution("prefect-swarm")
        meta = dist.read_text("METADATA") or ""
        entry_points = dist.read_text("entry_points.txt") or ""
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        meta, entry_points = "", ""
    if not meta:
        meta = f"Metadata-Version: 2.1\nName: prefect-swarm\nVersion: {__version__}\n"
    entries: list[tuple[str, bytes]] = [(f"{DIST}/{p.relative_to(root).as_posix()}", p.read_bytes()) for p in files]
    entries.append((f"{info}/METADATA", meta.encode()))
    if entry_points:
        entries.append((f"{info}/entry_points.txt", entry_points.encode()))
    entries.append(
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: prefect-swarm\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    )
    record = "".join(f"{name},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}\n" for name, data in entries)
    entries.append((f"{info}/RECORD", (record + f"{info}/RECORD,,\n").encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            zi = zipfile.ZipInfo(name, _EPOCH)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return f"{DIST}-{__version__}-py3-none-any.whl", buf.getvalue()


def staged_path(shared_path: str) -> str:
    """Where the wheel of this prefect-swarm lies under ``shared_path`` (staged or not)."""
    name, data = wheel_bytes()
    digest = hashlib.sha256(data).hexdigest()[:12]
    return os.path.join(shared_path, WHEELS_DIR, f"{__version__}-{digest}", name)


def stage(shared_path: str) -> str:
    """Write the wheel under ``shared_path`` unless it is there already; its path."""
    path = Path(staged_path(shared_path))
    _name, data = wheel_bytes()
    if not (path.is_file() and path.stat().st_size == len(data)):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, data)
        path.chmod(0o644)  # a job may run as another user than this process: it only reads it
    return str(path)


def install_line(python: str, wheel: str) -> str:
    """The job-setup shell line: install ``wheel`` with ``python``'s pip unless that interpreter
    imports this version of prefect-swarm already."""
    check = f"import prefect_swarm, sys; sys.exit(prefect_swarm.__version__ != {__version__!r})"
    py, failed = shlex.quote(python), shlex.quote(f"{INSTALL_FAILED} {wheel} with {python}")
    return (
        f"{{ {py} -c {shlex.quote(check)} 2>/dev/null || {py} -m pip install --quiet "
        f"--disable-pip-version-check --no-input {shlex.quote(wheel)} || {{ echo {failed}; exit 1; }}; }}"
    )


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
