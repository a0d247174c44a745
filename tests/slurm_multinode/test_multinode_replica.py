"""A replica spanning both nodes of the two-node test Slurm: Ray across the nodes, the stub engine
on rank 0 (healthy only once Ray reports 2 alive nodes), served through the LB, a sharded job,
a killed Ray worker (the replica is replaced as one unit), and nothing left on either node after
`down`.

The prefect-swarm CLI runs on the cluster's controller machine (its network and hostnames, like a
login node), with SLURM_CONF pointing at the two-node cluster; the test reads the shared files and
each node's processes from outside.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _twonode import NODES, TwoNodeCluster

from prefect_swarm.config.backends import DEFAULT_EXPORT
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing import free_port_block
from prefect_swarm.testing.stub_engine import StubEngine, engine_command
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.slurm_multinode, pytest.mark.slow]

CLI = Path(sys.executable).parent / "prefect-swarm"
LEFTOVER = re.compile(
    rb"raylet|gcs_server|ray::|ray/_private|ray/dashboard|ray/autoscaler|default_worker|ray\.scripts"
    rb"|prefect_swarm\.testing\.stub_engine|prefect_swarm\.sidecar\.watchdog"
)
"""Command lines of Ray's processes, the engine and its watchdog."""


class Controller:
    """Runs the prefect-swarm CLI inside the controller machine's namespaces."""

    def __init__(self, cluster: TwoNodeCluster, env: dict[str, str], run_dir: Path) -> None:
        self.pid = int((cluster.root / "run" / "ctl.pid").read_text())
        self.env = env
        self.run_dir = run_dir

    def argv(self, *args: str) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-n", "-u", "-m", "-p", str(CLI), *args]

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), capture_output=True, text=True, env=self.env, timeout=timeout)

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env
        )

    def ok(self, *args: str, timeout: float = 300) -> str:
        out = self.cli(*args, timeout=timeout)
        assert out.returncode == 0, (
            f"prefect-swarm {' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}\n{self.swarm_logs()}"
        )
        return out.stdout

    def swarm_logs(self, tail: int = 3000) -> str:
        """The end of every log the swarm's jobs wrote (replica ranks, watchdog, sbatch output): what a
        failed bring-up on a loaded CI machine needs to be understood without a rerun."""
        logs = sorted(p for p in self.run_dir.glob("swarms/*/*") if p.suffix in (".log", ".out", ".err"))
        return "\n".join(f"--- {p.name} (last {tail} chars)\n{p.read_text(errors='replace')[-tail:]}" for p in logs)


def leftovers(cluster: TwoNodeCluster, node: str) -> list[str]:
    return cluster.processes(node, LEFTOVER, width=160)


@pytest.fixture
def swarm_env(two_node_cluster: TwoNodeCluster, tmp_path: Path) -> Iterator[tuple[Controller, str, Path]]:
    """(controller, swarm name, config file) of a 1-replica x 2-node swarm; `down` on every exit path."""
    name = f"mn-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"  # the nodes share the file system: every node sees it
    cfg = {
        "name": name,
        "model": "stub-model",
        "replicas": 1,
        "gpus_per_replica": 4,
        "gpus_per_node": 2,
        "port": 8100,
        "engine": {
            "kind": "command",
            "command": engine_command(),
            "args": ["--require-ray-nodes", "2", "--latency-ms", "150"],
            "startup_timeout_s": 300,  # Ray's start on two loaded cores took minutes in CI
        },
        "backend": {
            "type": "slurm",
            "cpus_per_replica": 1,
            "queue_timeout_s": 60,
            "time_limit": "15:00",
            "run_dir": str(run_dir),
            "open_endpoint": True,
            "export": [*DEFAULT_EXPORT, "SLURM_CONF"],
        },
    }
    cfg_file = tmp_path / "swarm.json"
    cfg_file.write_text(json.dumps(cfg))
    env = {
        **two_node_cluster.env,
        "PREFECT_SWARM_HOME": str(tmp_path / "home"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    ctl = Controller(two_node_cluster, env, run_dir)
    try:
        yield ctl, name, cfg_file
    finally:
        ctl.cli("down", name, "-y", "--force", timeout=180)


def test_two_node_replica_serves_survives_a_lost_ray_worker_and_leaves_nothing(
    two_node_cluster: TwoNodeCluster, swarm_env: tuple[Controller, str, Path], tmp_path: Path
) -> None:
    ctl, name, cfg_file = swarm_env
    paths = SwarmPaths.for_swarm(name, tmp_path / "run")
    started = time.time()

    ctl.ok("up", "-c", str(cfg_file), "--timeout", "420", timeout=480)
    record = json.loads(paths.slurm_record.read_text())
    first_task = record["tasks"]["0"]
    cluster_file = (paths.root / "replica-0.cluster").read_text()
    assert cluster_file.startswith("ray ") and "nodes node1 node2" in cluster_file, cluster_file
    assert "ray cluster ready: 2 nodes" in (paths.root / "replica-0.rank-0.log").read_text()
    assert (paths.root / "replica-0.rank-1.log").exists()
    assert "stub engine: 2 alive Ray node(s)" in paths.replica_log(0).read_text()  # ready only through Ray
    # Ray's scratch on each node (they share this machine's /tmp): new random folders, 0700, the owner's
    # (Ray makes its own temp dir inside 0777: nobody else can reach it)
    scratch = [p for p in Path("/tmp").glob("psw-ray-*") if p.stat().st_mtime >= started - 1]
    assert len(scratch) == 2, scratch
    assert [oct(p.stat().st_mode & 0o777) for p in scratch] == ["0o700", "0o700"], scratch
    assert all((p / "ray").is_dir() for p in scratch), scratch

    # served through the LB (addressed by the node's bridge address from out here)
    def lb_url() -> str:
        node, port = paths.lb_head.read_text().split()[0].rsplit(":", 1)
        return f"http://{two_node_cluster.address(node)}:{port}"

    chat = httpx.post(
        lb_url() + "/v1/chat/completions",
        json={"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=30,
    )
    assert chat.status_code == 200, chat.text

    # a sharded job (2 shards, one request at a time each, 150 ms per answer: ~6 s of work per shard) ...
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [f"r{i:03d}" for i in range(80)]
    pq.write_table(pa.table({"id": ids, "prompt": [f"q {i}" for i in range(80)]}), tmp_path / "in.parquet")
    out_file = tmp_path / "out.parquet"
    spec = {
        "input": str(tmp_path / "in.parquet"),
        "output": str(out_file),
        "id_column": "id",
        "shards": 2,
        "concurrency": 1,
        "max_retries": 600,  # rides out the replacement (~20 s quiet, minutes on loaded CI): retries <= 1 s apart
        "backoff_max_s": 1,
        "checkpoint_every": 5,
        "checkpoint_seconds": 1,
        "job_kwargs": {"sampling": {"max_tokens": 4}},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    # submit waits for the job (a detached submit reads sacct, which the two-node cluster does not run)
    submit = ctl.start("job", "submit", "-n", name, "--spec", str(tmp_path / "spec.json"), "--id", "mnjob")

    def answered() -> int:
        node, port = paths.replica_head(0).read_text().split()[0].rsplit(":", 1)
        return int(httpx.get(f"http://{two_node_cluster.address(node)}:{port}/stats", timeout=5).json()["requests"])

    wait_until("the job's first answers", answered, until=lambda n: n >= 10, timeout_s=60, poll_s=0.5)

    # ... during which the Ray worker on node2 dies: the replica fails as one unit, the reconciler replaces it
    raylets = [
        pid
        for pid in two_node_cluster.node_pids("node2")
        if b"raylet" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    ]
    assert raylets, f"no raylet on node2: {leftovers(two_node_cluster, 'node2')}"
    for pid in raylets:
        os.kill(pid, signal.SIGKILL)
    wait_until(
        "the replica's task to be replaced",
        lambda: json.loads(paths.slurm_record.read_text())["tasks"].get("0"),
        until=lambda task: task not in (None, first_task),
        timeout_s=300,
    )
    assert "node rank 1 was lost" in (paths.root / "watchdog-0.log").read_text()

    # the job ends once, every row exactly once: no row was lost with the replica
    out, err = submit.communicate(timeout=420)
    assert submit.returncode == 0, f"job submit -> {submit.returncode}\n{out}\n{err}"
    assert sorted(pq.read_table(out_file, columns=["id"]).column("id").to_pylist()) == ids
    chat = httpx.post(
        lb_url() + "/v1/chat/completions",
        json={"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=30,
    )
    assert chat.status_code == 200, chat.text  # the replacement serves behind the LB

    ctl.ok("down", name, "-y", "--force", timeout=180)
    # down returns once the swarm's jobs left the queue: by then each node's Ray is gone, its renamed
    # agents (ray::DashboardAgent, ray::RuntimeEnvAgent) included -- found by their process group
    for node in NODES:
        assert not (left := leftovers(two_node_cluster, node)), f"left on {node} after down: {left}"
    # nor Ray's scratch (backend.node_tmp/psw-ray-<random>), on the worker node as on the head's
    # (the nodes share this machine's /tmp)
    scratch = [p.name for p in Path("/tmp").glob("psw-ray-*") if p.stat().st_mtime >= started - 1]
    assert scratch == [], scratch


def test_the_stub_is_not_ready_without_its_ray_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """--require-ray-nodes: no Ray cluster at RAY_ADDRESS, so /health stays 503 (the knob the test above relies on)."""
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port_block(1)}")
    with StubEngine(free_port_block(1), require_ray_nodes=2) as stub:
        for _ in range(6):
            assert httpx.get(stub.url + "/health", timeout=5).status_code == 503
            time.sleep(0.5)


ATTACKER = "psw-attacker"
"""The second Unix user of the Ray test (made by the fixture when missing, removed after when it made it)."""

JOIN_AS_ATTACKER = r"""
import os, sys
import ray
address = sys.argv[1]
try:
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
except Exception as exc:  # refused: what and why
    print("REFUSED", type(exc).__name__, str(exc)[:300].replace("\n", " "))
    sys.exit(3)
print("JOINED", os.getuid(), ray.get(ray.remote(lambda: os.getuid()).remote()))
"""
"""Run as the attacker on node2: a driver joining the replica's Ray cluster (and running a task) or refused."""

LISTENERS = r"""
import re, subprocess
out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
for line in out.splitlines():
    fields = line.split()
    local = fields[3]
    for pid in re.findall(r"pid=(\d+)", line):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        print(local, pid, cmd[:200])
"""
"""Run inside a node's namespaces: ``local-address pid cmdline`` of every listening TCP socket."""


@pytest.fixture(scope="module")
def attacker() -> Iterator[str]:
    """A second, unprivileged Unix user."""
    made = subprocess.run(["id", ATTACKER], capture_output=True).returncode != 0
    if made:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER], check=True
        )
    try:
        yield ATTACKER
    finally:
        if made:
            subprocess.run(["userdel", ATTACKER], check=False)


def attacker_python() -> list[str]:
    """An interpreter another user can run, with this venv's ray importable: ``env PYTHONPATH=... pythonX.Y``
    (the venv's own interpreter may live in a home other users cannot enter)."""
    import ray

    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [p for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}") if os.access(p, os.X_OK)]
    if not found:
        pytest.fail(f"no {version} outside this venv for the second user to run ray with", pytrace=False)
    return ["env", f"PYTHONPATH={Path(ray.__file__).parents[1]}", found[0]]


def on_node(
    cluster: TwoNodeCluster, node: str, *argv: str, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in ``node``'s namespaces (its network, hostname, mounts and processes), as ``user``."""
    pid = (cluster.root / "run" / f"{node}.pid").read_text().strip()
    as_user = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--reset-env"] if user else []
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp"}  # nothing of ours (no RAY_* either)
    return subprocess.run(
        ["nsenter", "-t", pid, "-n", "-u", "-m", "-p", *as_user, "env", *(f"{k}={v}" for k, v in env.items()), *argv],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_another_user_cannot_join_the_replicas_ray_cluster_which_listens_only_on_the_cluster_address(
    two_node_cluster: TwoNodeCluster, swarm_env: tuple[Controller, str, Path], tmp_path: Path, attacker: str
) -> None:
    ctl, name, cfg_file = swarm_env
    paths = SwarmPaths.for_swarm(name, tmp_path / "run")
    os.chmod(tmp_path, 0o755)  # the attacker may read the run dir (a shared project folder); the token stays 0600
    ctl.ok("up", "-c", str(cfg_file), "--timeout", "420", timeout=480)

    token = paths.ray_token_file
    assert oct(token.stat().st_mode & 0o777) == "0o600" and len(token.read_text().strip()) == 64
    others = [p for p in paths.root.rglob("*") if p.is_file() and p != token]
    assert [p for p in others if token.read_bytes().strip() in p.read_bytes()] == []  # not in a script or log
    address = (paths.root / "replica-0.cluster").read_text().split()[1]  # "ray <ip>:<gcs port>"
    assert address.split(":")[0] == two_node_cluster.address("node1")

    # another user, on node2 (another address of the cluster's network): `ray start --address` is refused ...
    python = attacker_python()
    ray_cli = [*python, "-m", "ray.scripts.scripts"]
    join = on_node(
        two_node_cluster, "node2", *ray_cli, "start", f"--address={address}", "--disable-usage-stats",
        "--temp-dir=/tmp/psw-attacker-ray", "--num-cpus=1", user=attacker,
    )  # fmt: skip
    assert join.returncode != 0, f"{attacker} joined the swarm's Ray cluster:\n{join.stdout}\n{join.stderr}"
    assert re.search(r"(?i)auth|token|unauthenticated", join.stdout + join.stderr), join.stdout + join.stderr
    # ... as is a driver (ray.init), with no token or a guessed one
    for extra in ([], ["RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN=" + "0" * 64]):
        driver = on_node(
            two_node_cluster, "node2", "env", *extra, *python, "-c", JOIN_AS_ATTACKER, address, user=attacker
        )
        assert driver.returncode == 3 and driver.stdout.startswith("REFUSED"), (extra, driver.stdout, driver.stderr)
    # nothing of the attacker runs on either node, and the replica's cluster still has exactly its two nodes
    uid = int(subprocess.run(["id", "-u", attacker], capture_output=True, text=True, check=True).stdout)
    for node in NODES:
        theirs = [p for p in two_node_cluster.node_pids(node) if Path(f"/proc/{p}").stat().st_uid == uid]
        assert theirs == [], (node, theirs)
    owner = on_node(
        two_node_cluster, "node1", "env", "RAY_AUTH_MODE=token", f"RAY_AUTH_TOKEN_PATH={token}", sys.executable, "-c",
        "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
        "print(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']))", address,
    )  # fmt: skip
    assert owner.returncode == 0, owner.stderr
    assert owner.stdout.strip().splitlines()[-1] == str(sorted(two_node_cluster.address(n) for n in NODES))

    # Ray listens only on the node's cluster address or loopback, no dashboard; except that Ray 2.60 binds
    # its core gRPC servers (GCS, raylet, core workers) to the wildcard whenever the node address is not
    # loopback, whatever --node-ip-address says (ray-project/ray#60012 reverted binding them to the node
    # address; #65867 describes the rule): those are the ports the token closes (refused above).
    listening: dict[str, str] = {}
    for node in NODES:
        node_ip = two_node_cluster.address(node)
        seen = on_node(two_node_cluster, node, sys.executable, "-c", LISTENERS)
        assert seen.returncode == 0, seen.stderr
        listening[node] = seen.stdout
        print(f"--- Ray's listening sockets on {node} ({node_ip}):")  # shown with -rP: the report's evidence
        ray_sockets = [line.split(" ", 2) for line in seen.stdout.splitlines() if RAY_PROCESS.search(line.encode())]
        print("\n".join(f"{s[0]:>22} {s[2][:90]}" for s in ray_sockets))
        assert ray_sockets, f"no Ray socket found on {node}:\n{seen.stdout}"
        wide = [s for s in ray_sockets if s[0].rsplit(":", 1)[0] not in (node_ip, "127.0.0.1")]
        beyond = [s for s in wide if not (s[0].startswith(("*:", "0.0.0.0:", "[::]:")) and RAY_CORE_GRPC.search(s[2]))]
        assert beyond == [], f"Ray listens beyond {node_ip} and loopback on {node}: {beyond}"
        assert not any("dashboard/dashboard.py" in s[2] for s in ray_sockets), ray_sockets
    gcs = [line for line in listening["node1"].splitlines() if "gcs_server" in line]
    assert any(line.split()[0].endswith(":" + address.rsplit(":", 1)[1]) for line in gcs), gcs


RAY_PROCESS = re.compile(rb"raylet|gcs_server|ray::|ray/_private|ray/dashboard|default_worker|ray\.scripts")
"""Command lines of Ray's own processes (the engine and its watchdog listen where the replica serves)."""

RAY_CORE_GRPC = re.compile(r"ray/core/src/ray/(gcs/gcs_server|raylet/raylet) |^ray::")
"""Ray's core gRPC servers, which Ray 2.60 binds to the wildcard for a non-loopback node address."""
