"""The replica watchdog, through the local backend, with the stub engine (fast)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from local_kit import STUB, wait_for

from prefect_swarm.interfaces import ReplicaHealth, ServingPhase
from prefect_swarm.swarm import Swarm

FAIL = ["{python}", "-c", "import sys; print('BOOM from the engine', flush=True); sys.exit(1)"]

# /health answers 200 for 2 s after start, then 503 forever: a live but unhealthy engine
FLAKY = [
    "{python}",
    "-c",
    (
        "import http.server, sys, time\n"
        "t0 = time.time()\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200 if time.time() - t0 < 2 else 503); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()\n"
    ),
    "{host}",
    "{port}",
]


def _stub_after(prelude: str) -> list[str]:
    """The stub engine's command, run in one ``python -c`` after ``prelude``."""
    code = f"import sys\n{prelude}\nfrom prefect_swarm.testing.stub_engine import main; main(sys.argv[1:])\n"
    return ["{python}", "-c", code, *STUB[3:]]  # STUB[:3] is "{python} -m <stub module>"


# the engine starts a grandchild (as vLLM starts its engine core) before serving
FORKING = _stub_after("import subprocess\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])")

# the stub reads its key from STUB_API_KEY; the engine gets it as PREFECT_SWARM_API_KEY
KEYED = _stub_after("import os\nos.environ['STUB_API_KEY'] = os.environ['PREFECT_SWARM_API_KEY']")

# an engine whose log would keep its key: in its own words, as an access log's request line with the
# key as a query parameter, and as a header; the watchdog's copy of its output masks all three
LEAKY = _stub_after(
    "import os\nkey = os.environ['PREFECT_SWARM_API_KEY']\nos.environ['STUB_API_KEY'] = key\n"
    "print(f'INFO: started with key {key}', flush=True)\n"
    "print('INFO: 127.0.0.1:4242 - \"GET /v1/models?api_key=' + key + '&x=1 HTTP/1.1\" 200 OK', flush=True)\n"
    "print('DEBUG: headers Authorization: Bearer ' + key, flush=True)"
)


def _pid(swarm: Swarm, i: int = 0) -> int:
    pid = swarm.status().replicas[i].external_id
    assert pid
    return int(pid)


def test_sigkill_of_a_replica_is_restarted(local_swarm: Callable[..., Swarm]) -> None:
    swarm = local_swarm(replicas=2)
    old = _pid(swarm, 1)
    os.kill(old, signal.SIGKILL)
    st = wait_for(swarm, lambda s: s.replicas[1].restarts >= 1 and s.replicas[1].health.value == "Healthy")
    assert _pid(swarm, 1) != old
    assert st.replicas[1].last_exit_code == -signal.SIGKILL
    assert st.replicas[0].restarts == 0
    assert st.phase is ServingPhase.RUNNING


def test_unhealthy_replica_is_restarted(local_swarm: Callable[..., Swarm]) -> None:
    swarm = local_swarm(command=FLAKY, ready=False, backend={"max_restarts": 5})
    wait_for(swarm, lambda s: s.replicas[0].health is ReplicaHealth.HEALTHY)
    first = _pid(swarm)
    wait_for(swarm, lambda s: s.replicas[0].restarts >= 1, timeout_s=20)
    wait_for(swarm, lambda s: s.replicas[0].health is ReplicaHealth.HEALTHY)
    assert _pid(swarm) != first


def test_gives_up_after_max_restarts_with_the_log_tail(local_swarm: Callable[..., Swarm]) -> None:
    swarm = local_swarm(replicas=2, command=FAIL, ready=False, backend={"max_restarts": 2})
    st = wait_for(swarm, lambda s: all("gave up" in r.detail for r in s.replicas))
    assert st.phase is ServingPhase.FAILED
    for rep in st.replicas:
        assert rep.health is ReplicaHealth.UNHEALTHY
        assert rep.restarts == 2 and rep.last_exit_code == 1
        assert "BOOM from the engine" in rep.log_tail
        assert "gave up" in rep.detail
    raw = json.loads(swarm.paths.replica_status(0).read_text())
    assert raw["failed"] is True
    time.sleep(0.5)
    dog = raw["watchdog_pid"]
    assert not psutil.pid_exists(dog) or psutil.Process(dog).status() == "zombie"


def test_wall_time_stops_the_replica(local_swarm: Callable[..., Swarm]) -> None:
    # not waited ready: on a loaded machine readiness may take longer than the wall time itself
    swarm = local_swarm(ready=False, backend={"wall_time_s": 5})
    replica = None
    deadline = time.monotonic() + 5
    while replica is None and time.monotonic() < deadline:
        pid = swarm.status().replicas[0].external_id
        replica = psutil.Process(int(pid)) if pid else None
        time.sleep(0.05)
    assert replica is not None, "the watchdog never reported its replica's pid"
    st = wait_for(swarm, lambda s: s.phase is ServingPhase.STOPPED, timeout_s=30)
    assert "wall time" in json.loads(swarm.paths.replica_status(0).read_text())["detail"]
    assert st.replicas[0].health is ReplicaHealth.UNKNOWN
    assert not replica.is_running() or replica.status() == "zombie"


def test_sigterm_to_the_watchdog_stops_the_whole_replica_group(local_swarm: Callable[..., Swarm]) -> None:
    swarm = local_swarm(command=FORKING)
    replica = psutil.Process(_pid(swarm))
    family = [replica, *replica.children(recursive=True)]
    assert len(family) >= 2
    dog = swarm.handle.meta["watchdogs"][0]["pid"]  # type: ignore[union-attr]
    os.kill(dog, signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=15)
    assert alive == []
    assert json.loads(swarm.paths.replica_status(0).read_text())["stopped"] is True


def test_api_key_reaches_the_engine_only_through_the_environment(local_swarm: Callable[..., Swarm]) -> None:
    key = "sk-very-secret-0123456789"
    swarm = local_swarm(command=KEYED, api_key=key)  # ready = the chat probe passed the stub's key check
    assert swarm.status().phase is ServingPhase.RUNNING
    home = Path(os.environ["PREFECT_SWARM_HOME"])
    leaks = [p for p in home.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert [p.name for p in leaks] == ["swarm.key"] and leaks[0].stat().st_mode & 0o777 == 0o600, leaks  # jobs read it
    with sqlite3.connect(home / "state.db") as db:
        assert key not in json.dumps(db.execute("SELECT * FROM swarms").fetchall())
    replica = psutil.Process(_pid(swarm))
    dog = psutil.Process(swarm.handle.meta["watchdogs"][0]["pid"])  # type: ignore[union-attr]
    for proc in (dog, replica):
        assert key not in " ".join(proc.cmdline())
    assert replica.environ()["VLLM_API_KEY"] == key


def test_watchdog_spec_file_runs_standalone(tmp_path: Path) -> None:
    """`python -m prefect_swarm.sidecar.watchdog --spec FILE` works on its own and stops on SIGTERM."""
    import subprocess

    from prefect_swarm.backends.engine import substitute
    from prefect_swarm.paths import SwarmPaths
    from prefect_swarm.sidecar.watchdog import WatchdogSpec
    from prefect_swarm.testing import free_port

    port = free_port()
    argv = substitute(STUB, python=sys.executable, host="127.0.0.1", port=port, served_model_name="m")
    spec = WatchdogSpec(
        swarm="x", root=str(tmp_path), index=0, argv=argv, url=f"http://127.0.0.1:{port}", health_interval_s=0.2
    )
    spec_file = tmp_path / "watchdog-0.json"
    spec_file.write_text(json.dumps(spec.to_dict()))
    dog = subprocess.Popen([sys.executable, "-m", "prefect_swarm.sidecar.watchdog", "--spec", str(spec_file)])
    status = SwarmPaths(tmp_path).replica_status(0)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            data = json.loads(status.read_text()) if status.exists() else {}
            if data.get("health") == "Healthy":
                break
            time.sleep(0.1)
        assert data["health"] == "Healthy" and data["pid"] and data["restarts"] == 0
        dog.send_signal(signal.SIGTERM)
        assert dog.wait(15) == 0
        assert not psutil.pid_exists(data["pid"])
    finally:
        if dog.poll() is None:
            dog.kill()


def test_watchdog_logs_changes_of_health_not_every_probe(tmp_path: Path) -> None:
    """A healthy replica probed 5 times a second for 3 s: its watchdog log says it started and
    turned healthy, and nothing per probe (httpx logged one INFO line per request: ~30 a minute)."""
    import subprocess

    from prefect_swarm.backends.engine import substitute
    from prefect_swarm.paths import SwarmPaths
    from prefect_swarm.sidecar.watchdog import WatchdogSpec
    from prefect_swarm.testing import free_port

    port = free_port()
    argv = substitute(STUB, python=sys.executable, host="127.0.0.1", port=port, served_model_name="m")
    spec = WatchdogSpec(
        swarm="x", root=str(tmp_path), index=0, argv=argv, url=f"http://127.0.0.1:{port}", health_interval_s=0.2
    )
    spec_file = tmp_path / "watchdog-0.json"
    spec_file.write_text(json.dumps(spec.to_dict()))
    log = tmp_path / "watchdog-0.log"
    with log.open("wb") as out:
        dog = subprocess.Popen(
            [sys.executable, "-m", "prefect_swarm.sidecar.watchdog", "--spec", str(spec_file)], stderr=out
        )
    status = SwarmPaths(tmp_path).replica_status(0)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and '"Healthy"' not in (status.read_text() if status.exists() else ""):
            time.sleep(0.1)
        time.sleep(3)  # ~15 probes of a healthy replica
        probes_seen = json.loads(status.read_text())["updated_at"]
        assert probes_seen
    finally:
        dog.send_signal(signal.SIGTERM)
        dog.wait(15)
    lines = log.read_text().splitlines()
    assert not [line for line in lines if "HTTP Request" in line], lines
    assert any("Unknown -> Healthy" in line for line in lines), lines
    assert len(lines) <= 5, lines  # started, Unknown -> Healthy, stopping


def test_the_engines_log_keeps_no_secret_and_every_file_is_the_users_alone(local_swarm: Callable[..., Swarm]) -> None:
    """The engine's output reaches replica-<i>.log through the watchdog's redaction: its key, a
    query string of a request line, an Authorization header are masked; the swarm folder lists
    nothing another user may read (``find -perm /077``)."""
    key = "sk-leaky-secret-0123456789"
    swarm = local_swarm(command=LEAKY, api_key=key)
    assert swarm.status().phase is ServingPhase.RUNNING
    text = swarm.paths.replica_log(0).read_text()
    assert "INFO: started with key ***" in text, text
    assert '"GET /v1/models?*** HTTP/1.1" 200' in text and "Authorization: ***" in text, text
    assert key not in text
    home = Path(os.environ["PREFECT_SWARM_HOME"])
    opened = subprocess.run(["find", str(home), "-perm", "/077"], capture_output=True, text=True, check=True)
    assert opened.stdout.split() == [], opened.stdout
