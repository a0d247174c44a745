"""A stranger's path: the commands of the Getting-started pages, in page order, as one shell script,
reach a scheduled deployment whose scheduled run completes on a worker.

The script is the pages' ```bash blocks joined, with the substitutions of :func:`_here`: a free port for
4200, a folder of the test for ``$HOME/.prefect`` and ``/tmp/``, and an interval of 20 s for the
page's hour (the first scheduled run comes one interval after the deploy). What does not run
here: the installs (this test runs in the venv the lock installed), listed in :data:`NOT_HERE`.
After the script (which also runs a deployment by hand with ``--watch``), the test waits on the API
for a run of the scheduled deployment that its schedule created to be Completed, then stops the
worker and the server the script started (their process groups: the script runs with ``set -m``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from prefect_swarm.testing import free_port, free_port_block
from prefect_swarm.testing.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
PAGES = ["docs/getting-started/install.md", "docs/getting-started/local.md", "docs/getting-started/deployment.md"]
"""The Getting-started pages with commands, in the order the site's navigation gives them."""

NOT_HERE = {
    "pip install": "installs: this test runs in the venv the lock installed (make venv)",
}

SCHEDULE_S = 20
"""The test's schedule interval (the page's is an hour)."""

pytestmark = [pytest.mark.slow]  # a server of its own, not the suite's Prefect stack


def page_script(page: str) -> list[str]:
    """The commands of ``page``'s ```bash blocks, continuations joined, comments kept out."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", (REPO / page).read_text(), flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            cmd = re.split(r"\s+#\s", " " + line.strip(), maxsplit=1)[0].strip()
            if cmd and not cmd.startswith("#"):
                out.append(cmd)
    return out


def _here(cmd: str, tmp_path: Path, port: int) -> str:
    """``cmd`` on this machine: this test's folder for /tmp/ and $HOME/.prefect, a free port for 4200, and
    a schedule every minute instead of every hour (so that its first run comes within the test)."""
    cmd = cmd.replace("/tmp/", f"{tmp_path}/").replace("$HOME/.prefect", f"{tmp_path}/prefect")
    return cmd.replace("4200", str(port)).replace("--interval 3600", f"--interval {SCHEDULE_S}")


def _kept(cmd: str) -> bool:
    return not any(cmd.removeprefix(".venv/bin/").startswith(p) for p in NOT_HERE)


def test_the_getting_started_pages_reach_a_scheduled_deployment_that_runs(tmp_path: Path) -> None:
    port = free_port()
    cmds = [c for page in PAGES for c in page_script(page) if _kept(c)]
    assert any(c.startswith("prefect --no-prompt deploy") and "--interval" in c for c in cmds), cmds
    script = "\n".join(["set -e -m", *(_here(c, tmp_path, port) for c in cmds)])
    (tmp_path / "script.sh").write_text(script + "\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PREFECT_SWARM_HOME": str(tmp_path / "swarm-home"),
        "PREFECT_SWARM_PORT": str(free_port_block(4)),  # the stub swarm's two replicas
    }
    api = f"http://127.0.0.1:{port}/api"
    proc = subprocess.Popen(
        ["bash", str(tmp_path / "script.sh")],
        cwd=REPO,
        env=env,
        stdout=(tmp_path / "script.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert proc.wait(timeout=420) == 0, (tmp_path / "script.log").read_text()[-4000:]
        run = _scheduled_run_completed(api, timeout_s=240)
        print(f"scheduled run {run['name']} of batch-inference/nightly: {run['state_type']}")
    finally:
        _stop_background(f"{tmp_path}/prefect")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)


def _scheduled_run_completed(api: str, timeout_s: float) -> dict[str, object]:
    deployment = httpx.get(f"{api}/deployments/name/batch-inference/nightly", timeout=10).json()
    assert deployment.get("schedules"), deployment

    def runs(*states: str) -> list[dict[str, object]]:
        body = {
            "deployments": {"id": {"any_": [deployment["id"]]}},
            "flow_runs": {"state": {"type": {"any_": list(states)}}},
            "limit": 10,
        }
        return list(httpx.post(f"{api}/flow_runs/filter", json=body, timeout=10).json())

    def completed() -> list[dict]:
        failed = runs("FAILED", "CRASHED")
        assert not failed, json.dumps(failed, indent=1)[:3000]
        return [r for r in runs("COMPLETED") if r.get("auto_scheduled")]

    return dict(wait_until("a scheduled run Completed", completed, timeout_s=timeout_s, poll_s=2)[0])


def _stop_background(home: str) -> None:
    """Stop the worker, then the server the script started (by their PREFECT_HOME: this test's)."""
    import psutil

    for role in ("worker", "server"):
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if role in (p.info["cmdline"] or []) and p.environ().get("PREFECT_HOME") == home:
                    os.killpg(os.getpgid(p.pid), signal.SIGTERM)
                    p.wait(timeout=30)
            except (psutil.Error, ProcessLookupError):
                continue
