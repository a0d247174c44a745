"""The backend factories the contract suite runs against, and helpers its tests share.

Every backend adds one :class:`BackendFactory` to :data:`FACTORIES`; each contract test then runs
once per backend (``-k local``, ``-k slurm`` pick one). A factory says how to build a config for
that backend, which pytest marks/gate it needs, and how to see what of a swarm still runs — the
suite checks behaviour, never backend internals.

The engines are the same on every backend (``engine.kind: command``, so no GPU is needed):

* ``stub``      — the stub OpenAI engine (answers at once);
* ``fail``      — prints ``ENGINE-BOOM`` and exits 1 (every start fails);
* ``blackhole`` — listens on the port but never answers (a dead endpoint that accepts connections).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from prefect_swarm.config import SwarmConfig
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing import free_port_block
from prefect_swarm.testing.stub_engine import engine_command

BOOM = "ENGINE-BOOM: cannot load model"

_BLACKHOLE = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64); time.sleep(3600)\n"
)

ENGINES: dict[str, list[str]] = {
    "stub": engine_command(),
    "fail": ["{python}", "-c", f"import sys; print({BOOM!r}, flush=True); sys.exit(1)"],
    "blackhole": ["{python}", "-c", _BLACKHOLE, "{host}", "{port}"],
}


@dataclass
class BackendFactory:
    """How the contract suite brings swarms up on one backend."""

    name: str
    backend: Callable[[], dict[str, Any]]
    """The ``backend:`` section, tuned for fast tests (short health intervals, few restarts)."""
    leftovers: Callable[[Swarm], list[str]]
    """Descriptions of anything of this swarm still running (replicas, watchdogs, jobs); [] once down."""
    gate: Callable[[], None] = lambda: None
    marks: list[Any] = field(default_factory=list)
    holding_gpus: Callable[[Swarm], list[str]] | None = None
    """What of this swarm holds GPUs now (its running replicas; a parked swarm: nothing); default: leftovers."""
    ready_timeout_s: float = 60.0
    status_budget_s: float = 1.0
    """Longest a status()/probe() call may take (it must never block on the swarm)."""
    stop_timeout_s: float = 60.0
    exit_codes: bool = True
    """Whether probe() can report a job's exit code (Lepton's API has none: it reports only the state)."""

    def config(self, replicas: int = 1, engine: str = "stub", **over: Any) -> SwarmConfig:
        """A config for ``replicas`` replicas of one of :data:`ENGINES` on this backend."""
        data: dict[str, Any] = {
            "name": f"ct-{uuid.uuid4().hex[:8]}",
            "model": "stub-model",
            "replicas": replicas,
            "gpus_per_replica": 0,
            "port": free_port_block(replicas),
            "engine": {
                "kind": "command",
                "command": ENGINES[engine],
                "python": sys.executable,
                "startup_timeout_s": 60,
            },
            "ready_timeout_s": self.ready_timeout_s,
            "backend": self.backend(),
        }
        data.update(over)
        return SwarmConfig.model_validate(data)


def local_leftovers(swarm: Swarm) -> list[str]:
    """Processes whose working folder or command line lies in the swarm's folder (watchdogs, replicas)."""
    root = str(swarm.paths.root)
    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            cwd = proc.cwd()
        except psutil.Error:
            cwd = ""
        cmd = " ".join(proc.info["cmdline"] or [])
        if cwd.startswith(root) or root in cmd:
            out.append(f"pid {proc.pid}: {cmd[:200]}")
    return out


LOCAL = BackendFactory(
    name="local",
    backend=lambda: {
        "type": "local",
        "health_interval_s": 0.3,
        "restart_backoff_s": 0.1,
        "startup_grace_s": 0.5,
        "max_restarts": 1,
        "wall_time_s": 600,
    },
    leftovers=local_leftovers,
)

_LEPTON: dict[str, Any] = {}
_LEPTON_TOKEN_ENV = "PSW_CONTRACT_LEPTON_TOKEN"


def _lepton_fake() -> Any:
    """One loopback fake Lepton workspace for the session, running the engine commands as given."""
    if "fake" not in _LEPTON:
        import atexit
        import tempfile

        from prefect_swarm.testing.fake_lepton import FakeLepton

        os.environ.setdefault("LEPTON_CACHE_DIR", tempfile.mkdtemp(prefix="lepton-cache-"))
        fake = _LEPTON["fake"] = FakeLepton(run_endpoint_commands=True).start()
        atexit.register(fake.close)
        os.environ[_LEPTON_TOKEN_ENV] = fake.token  # a reattaching child reads the token from its env
    return _LEPTON["fake"]


def lepton_backend() -> dict[str, Any]:
    """The fake workspace; the test's PREFECT_SWARM_HOME is the 'shared mount' jobs see."""
    fake, home = _lepton_fake(), os.environ["PREFECT_SWARM_HOME"]
    return {
        "type": "lepton",
        "workspace_id": fake.workspace_id,
        "workspace_url": fake.url,
        "token_env": _LEPTON_TOKEN_ENV,
        "mounts": [{"path": "/shared", "mount_path": home}],
        "shared_path": home,
        "ready_poll_s": 0.2,
    }


def lepton_leftovers(swarm: Swarm) -> list[str]:
    """The swarm's deployment while the fake has it, and its jobs whose processes still run."""
    fake, name = _lepton_fake(), swarm.cfg.name
    out = [f"deployment {name}"] if name in fake.deployments else []
    for jid, w in list(fake.jobs.items()):
        if (w.body["metadata"].get("labels") or {}).get("prefect-swarm-swarm") == name and w.alive():
            out.append(f"job {jid}")
    return out


def lepton_holding_gpus(swarm: Swarm) -> list[str]:
    """The swarm's deployment while it asks for replicas or runs one (scaled to zero it holds nothing)."""
    w = _lepton_fake().deployments.get(swarm.cfg.name)
    return [f"deployment {swarm.cfg.name}"] if w is not None and (w.min_replicas() > 0 or w.alive()) else []


def _lepton_gate() -> None:

    from services import gate, missing_lepton_sdk

    gate(missing_lepton_sdk())


def _lepton_marks() -> list[Any]:
    import pytest

    return [pytest.mark.lepton]


LEPTON = BackendFactory(
    name="lepton",
    backend=lepton_backend,
    leftovers=lepton_leftovers,
    holding_gpus=lepton_holding_gpus,
    gate=_lepton_gate,
    marks=_lepton_marks(),
    exit_codes=False,
)

FACTORIES: dict[str, BackendFactory] = {"local": LOCAL, "lepton": LEPTON}

from contract_slurm import SLURM  # noqa: E402  (defined in its own module; it imports from this one)

FACTORIES["slurm"] = SLURM
"""Backend name -> factory. Other backends register theirs here (with their gate and marks)."""


def run_py(code: str, *args: str, timeout: float = 120) -> str:
    """Run ``code`` in a NEW Python process (same PREFECT_SWARM_HOME); return its stdout, fail on error."""
    import subprocess

    res = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
    )
    assert res.returncode == 0, f"child failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res.stdout


def home() -> Path:
    """The test's PREFECT_SWARM_HOME."""
    return Path(os.environ["PREFECT_SWARM_HOME"])
