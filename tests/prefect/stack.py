"""A real Prefect stack for tests: `prefect server start` + a process worker, in a temp PREFECT_HOME.

Each process gets its own process group (like `set -m` in a script), so a stop signals the whole
tree; the worker is stopped before the server, each by its PID: SIGTERM, wait, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from prefect_swarm.testing import free_port

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
POOL = "swarm-pool"
POOL_TEMPLATE = "deployments/process-pool.json"
"""The pool's base job template: Prefect's process template plus ``swarm_home`` and ``result_storage``."""


@dataclass
class PrefectStack:
    """Server + worker; ``env`` is what a client process needs to talk to them."""

    home: Path
    swarm_home: Path
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        """The API base URL."""
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def env(self) -> dict[str, str]:
        """Environment for prefect CLI calls, the worker and the flow runs it starts."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            PREFECT_HOME=str(self.home),
            PREFECT_API_URL=self.api_url,
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            DO_NOT_TRACK="1",
            PREFECT_WORKER_QUERY_SECONDS="1",
            # the server's periodic services that no test waits on look once a minute, not every 5-15 s
            # (idle, they took 4.5 % of a core: about 60 CPU-seconds of a suite run on 2 cores)
            PREFECT_SERVER_SERVICES_LATE_RUNS_LOOP_SECONDS="60",
            PREFECT_SERVER_SERVICES_PAUSE_EXPIRATIONS_LOOP_SECONDS="60",
            PREFECT_SERVER_SERVICES_FOREMAN_LOOP_SECONDS="60",
            PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS="60",
            PREFECT_WORKER_PREFETCH_SECONDS="5",
            PREFECT_SWARM_HOME=str(self.swarm_home),
            PREFECT_CLI_COLORS="false",
            COLUMNS="200",
        )
        return env

    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `prefect ARGS` against this stack."""
        out = subprocess.run([PREFECT, *args], env=self.env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"prefect {' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
        return out

    def _spawn(self, name: str, *args: str) -> None:
        log = (self.home / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [PREFECT, *args],
            env=self.env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start_server(self, timeout_s: float = 180) -> None:
        """Start the server (with its UI: tests/prefect/test_ui_browser.py looks at it) and wait for /api/health."""
        self.home.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "server",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--analytics-off",
        )
        from prefect_swarm.testing.waiting import wait_until

        def health() -> int:
            if self.procs["server"].poll() is not None:
                raise AssertionError(f"prefect server exited; log: {(self.home / 'server.log').read_text()[-3000:]}")
            return httpx.get(self.api_url + "/health", timeout=2).status_code

        wait_until(
            "the Prefect server's /health", health, until=lambda code: code == 200, timeout_s=timeout_s, poll_s=0.25
        )

    def deploy(self) -> None:
        """Work pool, blocks, deployments, zombie automation (40 s: heartbeats every 30 s)."""
        self.cli("work-pool", "create", POOL, "--type", "process", "--base-job-template", POOL_TEMPLATE)
        self.cli("block", "register", "-m", "prefect_swarm.blocks")
        self.cli("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
        subprocess.run(
            [sys.executable, "-m", "prefect_swarm.cli.main", "automations", "install", "--within", "40"],
            env=self.env,
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start_worker(self) -> None:
        """A process worker polling every second."""
        self._spawn("worker", "worker", "start", "--pool", POOL, "--type", "process", "--name", "test-worker")

    def stop(self) -> None:
        """Worker first, then server: SIGTERM to the group, 15 s, then SIGKILL."""
        for name in ("worker", "server"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(5)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def job_variables(swarm_home: Path) -> dict[str, dict[str, str]]:
    """Job variables pointing a flow run at the test's PREFECT_SWARM_HOME (heartbeats kept on)."""
    return {"env": {"PREFECT_SWARM_HOME": str(swarm_home), "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}


def jv_arg(swarm_home: Path) -> list[str]:
    """The same as `prefect deployment run` arguments."""
    return ["--job-variable", "env=" + json.dumps(job_variables(swarm_home)["env"])]
