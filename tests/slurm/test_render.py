"""render.py is pure: config -> script text. Golden files pin the rendered command lines of each
container runtime; the quoting test runs a rendered script with hostile values and checks it is inert.

Regenerate the golden files after an intended change:
``PREFECT_SWARM_UPDATE_GOLDEN=1 pytest tests/slurm``.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prefect_swarm.backends.slurm import render
from prefect_swarm.backends.slurm.client import QueueEntry
from prefect_swarm.backends.slurm.serving import SlurmServing, SwarmJobs
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces import ServingPhase
from prefect_swarm.paths import SwarmPaths

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "slurm"
UPDATE = os.environ.get("PREFECT_SWARM_UPDATE_GOLDEN") == "1"
FAKE_APPTAINER = Path(__file__).resolve().parents[2] / "scripts" / "slurm" / "fake-apptainer"


def golden_cfg(runtime: str = "none", **backend: Any) -> SwarmConfig:
    """A fixed config: fixed paths and interpreters so the golden text does not depend on the machine."""
    container: dict[str, Any] = {"runtime": runtime}
    if runtime != "none":
        container |= {
            "image": "/images/vllm.sif" if runtime != "pyxis" else "nvcr.io#nvidia/vllm:24.05",
            "mounts": ["/data:/data:ro", "/models:/models"],
            "extra_args": ["--writable-tmpfs"] if runtime != "pyxis" else ["--container-workdir=/data"],
        }
    return SwarmConfig.model_validate(
        {
            "name": "golden",
            "model": "/models/llama-8b",
            "served_model_name": "llama",
            "replicas": 4,
            "gpus_per_replica": 2,
            "gpus_per_node": 4,
            "port": 8100,
            "engine": {
                "kind": "vllm",
                "python": "/opt/venv/bin/python",
                "args": ["--max-model-len", "8192"],
                "env": {"VLLM_LOGGING_LEVEL": "INFO"},
            },
            "backend": {
                "type": "slurm",
                "partition": "gpu",
                "account": "proj-1",
                "time_limit": "04:00:00",
                "cpus_per_replica": 8,
                "mem_per_replica": "64G",
                "run_dir": "/shared/psw",
                "job_python": "/opt/venv/bin/python",
                "requeue": True,
                "signal_seconds": 300,
                "setup": ["module load cuda/12.4"],
                "sbatch_args": ["--exclusive"],
                "container": container,
                **backend,
            },
        }
    )


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file (PREFECT_SWARM_UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("runtime", ["none", "apptainer", "singularity", "pyxis"])
def test_golden_plan(runtime: str) -> None:
    cfg = golden_cfg(runtime)
    plan = render.render_plan(cfg)
    assert sorted(plan) == [
        "lb.sbatch",
        "nginx.conf",
        "psw_key_guard.py",  # a closed vLLM swarm: the engine's --middleware
        "replicas.sbatch",
        "watchdog-0.json",
        "watchdog-1.json",
        "watchdog-2.json",
        "watchdog-3.json",
    ]
    check_golden(f"{runtime}/replicas.sbatch", plan["replicas.sbatch"])
    check_golden(f"{runtime}/watchdog-3.json", plan["watchdog-3.json"])
    step = render.step_argv(cfg, jobid="123", step_name="psw-golden-job-0-abc", command=["python", "-m", "x"])
    check_golden(f"{runtime}/step.argv", "\n".join(step) + "\n")
    if runtime == "none":
        check_golden("none/lb.sbatch", plan["lb.sbatch"])
        check_golden("none/nginx.conf", plan["nginx.conf"])


def test_plan_shapes_resources() -> None:
    plan = render.render_plan(golden_cfg())
    text = plan["replicas.sbatch"]
    # 4 replicas, 2 per node (gpus_per_node 4 / 2 per replica): 2 array tasks of 2 replicas each
    assert "#SBATCH --array=0-1\n" in text and "#SBATCH --gres=gpu:4\n" in text
    assert "#SBATCH --cpus-per-task=16\n" in text and "#SBATCH --mem=128G\n" in text
    assert "#SBATCH --signal=USR1@300\n" in text and "#SBATCH --requeue\n" in text
    spec = json.loads(plan["watchdog-1.json"])
    assert spec["argv"][spec["argv"].index("--tensor-parallel-size") + 1] == "2"
    assert spec["argv"][spec["argv"].index("--port") + 1] == render.PORT_TOKEN  # picked free at each start
    assert spec["preferred_port"] == 8101 and spec["port_token"] == render.PORT_TOKEN
    assert "#SBATCH --signal=USR1@300\n" in plan["lb.sbatch"], "job steps run in the LB job: they need the signal"


def test_golden_lb_resources() -> None:
    lb = {"cpus": 4, "mem": "8G", "partition": "cpu", "qos": "lb", "account": "proj-lb", "time_limit": "2-00:00:00"}
    text = render.render_plan(golden_cfg(lb=lb))["lb.sbatch"]
    check_golden("none/lb-resources.sbatch", text)
    for line in (
        "--cpus-per-task=4",
        "--mem=8G",
        "--partition=cpu",
        "--qos=lb",
        "--account=proj-lb",
        "--time=2-00:00:00",
    ):
        assert f"#SBATCH {line}\n" in text, line
    assert "--gres" not in text


def test_a_partial_last_task_asks_only_for_what_it_runs(tmp_path: Path) -> None:
    # 3 replicas x 2 GPUs on 4-GPU nodes: task 0 runs 2 replicas (gpu:4), task 1 runs one (gpu:2)
    cfg = golden_cfg().model_copy(update={"replicas": 3})
    assert "#SBATCH --gres=gpu:4\n" in render.render_plan(cfg)["replicas.sbatch"]
    serving = SlurmServing(cfg, SwarmPaths(tmp_path))
    assert serving._task_args() == {"1": ["--cpus-per-task=8", "--gres=gpu:2", "--mem=64G"]}
    assert SlurmServing(golden_cfg(), SwarmPaths(tmp_path))._task_args() == {}  # 4 replicas fill both tasks


def _entry(job: str, state: str) -> QueueEntry:
    return QueueEntry(job, job, job, None, "psw-golden-lb", state, "None", "node1")


@pytest.mark.parametrize("stopped", [None, "the LB job left the queue and is not replaced"])
def test_an_lb_job_that_is_completing_has_ended_it_is_not_starting(tmp_path: Path, stopped: str | None) -> None:
    """squeue shows a cancelled LB job as COMPLETING for a moment: no endpoint, not "starting"."""
    serving = SlurmServing(golden_cfg(run_dir=None), SwarmPaths(tmp_path))  # its record under tmp_path
    assert serving.paths.slurm_record.is_relative_to(tmp_path)
    if stopped:
        serving.paths.slurm_record.write_text(json.dumps({"stopped": {"reason": stopped}}))
    phase, detail = serving._phase(SwarmJobs(replicas=[], lb=_entry("41", "COMPLETING")), ())
    assert phase is ServingPhase.FAILED, detail
    ended = "the load balancer job has ended: no endpoint"
    assert detail == f"stopping: {stopped}" if stopped else detail.startswith(ended), detail
    phase, detail = serving._phase(SwarmJobs(replicas=[], lb=_entry("41", "PENDING")), ())
    assert phase is ServingPhase.PENDING, detail  # a queued LB job is still on its way
    assert serving._phase(SwarmJobs(replicas=[], lb=None), ())[0] is ServingPhase.STOPPED  # nothing queued


def test_a_replica_larger_than_a_node_must_take_whole_nodes(tmp_path: Path) -> None:
    cfg = golden_cfg().model_copy(update={"gpus_per_replica": 5})
    with pytest.raises(ConfigError, match=r"gpus_per_replica \(5\) exceeds gpus_per_node \(4\) but is not a multiple"):
        SlurmServing(cfg, SwarmPaths(tmp_path)).validate(cfg)


def multi_node_cfg(runtime: str = "none", kind: str = "vllm", **engine: Any) -> SwarmConfig:
    """The golden config with replicas of 8 GPUs on 4-GPU nodes: 2 nodes per replica."""
    cfg = golden_cfg(runtime)
    data = cfg.model_dump(by_alias=True)
    data |= {"replicas": 2, "gpus_per_replica": 8}
    data["engine"] |= {"kind": kind, **engine}
    return SwarmConfig.model_validate(data)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize("runtime", ["none", "apptainer"])
def test_golden_multi_node_plan(runtime: str, kind: str) -> None:
    parallel = {"parallel": {"tensor": 4, "pipeline": 2}} if kind == "vllm" else {}
    cfg = multi_node_cfg(runtime, kind, **parallel)
    plan = render.render_plan(cfg)
    script, spec = plan["replicas.sbatch"], json.loads(plan["watchdog-1.json"])
    check_golden(f"multinode-{runtime}/replicas-{kind}.sbatch", script)
    check_golden(f"multinode-{runtime}/watchdog-1-{kind}.json", plan["watchdog-1.json"])
    # one array task per replica, each of 2 nodes with every GPU of each node
    for line in ("--array=0-1", "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:4", "--cpus-per-task=8"):
        assert f"#SBATCH {line}\n" in script, line
    assert spec["peers_file"].endswith("/replica-1.peers")
    argv = spec["argv"]
    if kind == "vllm":
        assert "-m ray.scripts.scripts)\n" in script  # the engine interpreter's `ray`
        head, worker = script.index('"${RAY[@]}" start --head'), script.index("--block & wait $!' \\\n    _")
        assert head < worker < script.index("ray cluster ready")
        assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
        assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    else:
        assert "ray" not in " ".join(argv) and "ray.scripts" not in script
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "0"
        assert argv[argv.index("--dist-init-addr") + 1] == f"{render.HOST_TOKEN}:{render.DIST_PORT_TOKEN}"
        assert f"--node-rank {render.RANK_TOKEN}" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_validate_prints_the_ray_start_sequence_and_the_vllm_argv(tmp_path: Path) -> None:
    """`prefect-swarm validate` of a 2-node-per-replica config shows how each replica's Ray forms."""
    cfg_file = tmp_path / "swarm.yaml"
    data = multi_node_cfg(parallel={"tensor": 4, "pipeline": 2}).model_dump(by_alias=True)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    data |= {"model": str(tmp_path / "model")}
    data["backend"] |= {"run_dir": str(tmp_path / "run")}
    cfg_file.write_text(json.dumps(data))
    cli = Path(sys.executable).parent / "prefect-swarm"
    argv = [str(cli), "validate", "--offline", "-c", str(cfg_file), "-o", "json"]  # a site config: Slurm not asked
    out = subprocess.run(argv, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr + out.stdout
    plan = json.loads(out.stdout)["plan"]
    text = plan["replicas.sbatch"]
    assert text.index("start --head") < text.index("--block & wait $!' \\\n    _") < text.index("ray cluster ready")
    argv = json.loads(plan["watchdog-0.json"])["argv"]
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"


@pytest.mark.parametrize(
    ("update", "engine", "message"),
    [
        ({"gpus_per_replica": 6}, {}, r"gpus_per_replica \(6\) exceeds gpus_per_node \(4\) but is not a multiple"),
        (
            {"gpus_per_replica": 8},
            {"parallel": {"tensor": 4, "pipeline": 3}},
            r"engine.parallel.tensor \(4\) x engine.parallel.pipeline \(3\) = 12 must equal gpus_per_replica \(8\)",
        ),
        (
            {"gpus_per_replica": 2},
            {"parallel": {"tensor": 1}},
            r"engine.parallel.tensor \(1\) x engine.parallel.pipeline \(1\) = 1 must equal gpus_per_replica \(2\)",
        ),
    ],
)
def test_impossible_layouts_are_refused_naming_the_fields(
    update: dict[str, Any], engine: dict[str, Any], message: str, tmp_path: Path
) -> None:
    data = golden_cfg().model_dump(by_alias=True) | update
    data["engine"] |= engine
    cfg = SwarmConfig.model_validate(data)
    with pytest.raises(ConfigError, match=message):
        SlurmServing(cfg, SwarmPaths(tmp_path)).validate(cfg)


def test_single_node_parallel_sets_both_sizes_without_ray() -> None:
    data = golden_cfg().model_dump(by_alias=True)
    data["engine"] |= {"parallel": {"tensor": 1, "pipeline": 2}}
    plan = render.render_plan(SwarmConfig.model_validate(data))
    argv = json.loads(plan["watchdog-0.json"])["argv"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert "--distributed-executor-backend" not in argv and "ray start" not in plan["replicas.sbatch"]
    assert "#SBATCH --nodes=1\n" in plan["replicas.sbatch"]


def test_multi_node_replicas_refuse_pyxis(tmp_path: Path) -> None:
    cfg = multi_node_cfg("pyxis")
    with pytest.raises(ConfigError, match=r"backend.container.runtime 'pyxis'"):
        SlurmServing(cfg, SwarmPaths(tmp_path)).validate(cfg)


def test_render_plan_is_pure_and_submits_nothing(tmp_path: Path) -> None:
    cfg = golden_cfg(run_dir=str(tmp_path / "shared"))
    serving = SlurmServing(cfg, SwarmPaths(tmp_path / "unused"))
    assert serving.plan() == render.render_plan(cfg)
    assert not (tmp_path / "shared").exists() and not (tmp_path / "unused").exists()


def test_no_secret_in_any_rendered_file() -> None:
    cfg = golden_cfg().model_copy(update={"api_key": "sk-very-secret-123"})
    for name, text in render.render_plan(cfg).items():
        assert "sk-very-secret-123" not in text, name


@pytest.mark.parametrize("field", ["partition", "account", "qos", "constraint"])
def test_sbatch_values_with_newlines_are_refused(field: str) -> None:
    cfg = golden_cfg(**{field: "gpu\nrm -rf /tmp/x"})
    with pytest.raises(ConfigError, match=field):
        render.render_plan(cfg)


def test_sbatch_values_are_quoted() -> None:
    cfg = golden_cfg(account="a b;c'd", sbatch_args=["--comment=$(touch /tmp/x)"])
    text = render.render_plan(cfg)["replicas.sbatch"]
    assert "#SBATCH --account='a b;c'\"'\"'d'\n" in text
    assert "#SBATCH '--comment=$(touch /tmp/x)'\n" in text


HOSTILE = "$(touch {m}) ; touch {m} ` touch {m}` \"'\n touch {m} #"


def hostile_cfg(tmp: Path, marker: Path) -> SwarmConfig:
    bad = HOSTILE.format(m=marker)
    odd_dir = tmp / "dir with space;$(touch x)"
    return SwarmConfig.model_validate(
        {
            "name": "hostile",
            "model": bad,
            "served_model_name": bad,
            "replicas": 1,
            "gpus_per_replica": 0,
            "env": {"WEIRD": bad},
            "engine": {
                "kind": "command",
                "command": ["/bin/true", bad, "{model}"],
                "args": [bad],
                "env": {"E2": bad},
            },
            "backend": {
                "type": "slurm",
                "cpus_per_replica": 1,
                "job_python": str(odd_dir / bad),
                "nginx_bin": bad,
                "run_dir": str(odd_dir),
            },
        }
    )


def test_hostile_values_render_inert_scripts(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    cfg = hostile_cfg(tmp_path, marker)
    with pytest.raises(ConfigError, match="nginx"):  # nginx.conf cannot hold such a path: refused, not escaped
        render.render_plan(cfg)
    paths = render.swarm_paths(cfg)
    for name, text in (
        ("replicas.sbatch", render.render_replicas(cfg, paths)),
        ("lb.sbatch", render.render_lb(cfg, paths)),
    ):
        script = tmp_path / name
        script.write_text(text)
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, name
    assert json.loads(json.dumps(render.watchdog_spec(cfg, paths, 0)))["argv"][1] == HOSTILE.format(m=marker)


def test_hostile_prelude_executes_without_side_effects(tmp_path: Path) -> None:
    """Run the replica script under a fake Slurm environment with a python that records its argv:
    every hostile value reaches it as one literal argument and no marker file appears."""
    marker = tmp_path / "PWNED"
    cfg = hostile_cfg(tmp_path, marker)
    paths = render.swarm_paths(cfg)
    fake_python = Path(cfg.backend.job_python or "")  # type: ignore[union-attr]
    fake_python.parent.mkdir(parents=True)
    fake_python.write_text(f"#!/bin/bash\nprintf '%s\\n' \"$@\" >> {tmp_path / 'argv.log'}\necho 127.0.0.1\n")
    fake_python.chmod(fake_python.stat().st_mode | stat.S_IEXEC)
    paths.ensure()
    paths.watchdog_spec(0).write_text(json.dumps(render.watchdog_spec(cfg, paths, 0)))
    script = tmp_path / "replicas.sbatch"
    script.write_text(render.render_replicas(cfg, paths))
    env = {
        "PATH": os.environ["PATH"],
        "SLURMD_NODENAME": "localhost",
        "SLURM_ARRAY_TASK_ID": "0",
        "SLURM_ARRAY_JOB_ID": "1",
    }
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists() and not (Path.cwd() / "x").exists()
    logged = (tmp_path / "argv.log").read_text()
    assert "prefect_swarm.sidecar.watchdog" in logged
    assert str(paths.root / "watchdog-0.run.json") in logged


def test_fake_apptainer_runs_the_rendered_command(tmp_path: Path) -> None:
    """The apptainer prefix the golden file pins is accepted by the shim and runs the command."""
    cfg = golden_cfg("apptainer")
    argv = render.container_prefix(cfg.backend.container)  # type: ignore[union-attr]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").symlink_to(FAKE_APPTAINER)
    log = tmp_path / "apptainer.log"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_APPTAINER_LOG": str(log)}
    out = subprocess.run([*argv, "echo", "inside"], env=env, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0 and out.stdout.strip() == "inside", out.stderr
    assert "--nv -B /data:/data:ro -B /models:/models --writable-tmpfs /images/vllm.sif echo inside" in log.read_text()
    assert shutil.which("apptainer", path=str(bindir))


def test_golden_site_files_export_and_offline() -> None:
    """--chdir (run dir), --open-mode=append and the named --export list in both scripts; the
    replicas run with HF_HUB_OFFLINE=1 unless hf_offline is false; the user's env wins."""
    cfg = golden_cfg(run_dir="/scratch/me", export=["PATH", "HF_HOME"])
    plan = render.render_plan(cfg)
    check_golden("none/replicas-site.sbatch", plan["replicas.sbatch"])
    needed = "PREFECT_SWARM_HOME,PREFECT_SWARM_LOG_LEVEL,PREFECT_SWARM_API_KEY,VLLM_API_KEY"
    for script in ("replicas.sbatch", "lb.sbatch"):
        text = plan[script]
        assert "#SBATCH --chdir=/scratch/me/swarms/golden\n" in text and "#SBATCH --open-mode=append\n" in text
        assert f"#SBATCH --export=PATH,HF_HOME,{needed}\n" in text, script
    assert json.loads(plan["watchdog-0.json"])["env"]["HF_HUB_OFFLINE"] == "1"
    everything = render.render_plan(golden_cfg(export_all=True, hf_offline=False))
    assert (
        "#SBATCH --export=ALL\n" in everything["replicas.sbatch"]
        and "#SBATCH --export=ALL\n" in everything["lb.sbatch"]
    )
    assert "HF_HUB_OFFLINE" not in everything["watchdog-0.json"]
    online = golden_cfg().model_copy(update={"env": {"HF_HUB_OFFLINE": "0"}})
    assert json.loads(render.render_plan(online)["watchdog-0.json"])["env"]["HF_HUB_OFFLINE"] == "0"
    with pytest.raises(ConfigError, match=r"backend\.export"):
        render.render_plan(golden_cfg(export=["OK", "NOT-A-NAME"]))


def test_shared_dir_is_the_old_name_of_run_dir() -> None:
    old = golden_cfg().model_dump()
    old["backend"]["shared_dir"] = old["backend"].pop("run_dir")
    assert render.swarm_paths(SwarmConfig.model_validate(old)).root == Path("/shared/psw/swarms/golden")
    cfg = golden_cfg(run_dir="/scratch/x")
    assert render.swarm_paths(cfg).root == Path("/scratch/x/swarms/golden")


def test_a_local_model_path_is_checked_on_the_submit_host(tmp_path: Path) -> None:
    def check(model: str) -> None:
        cfg = golden_cfg().model_copy(update={"model": model})
        SlurmServing(cfg, SwarmPaths(tmp_path / "s")).validate(cfg, ask=False)  # a site config: Slurm not asked

    with pytest.raises(ConfigError, match=r"model '.*nope' \(the engine's model path\) does not exist"):
        check(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        check(str(tmp_path / "empty"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a directory"):
        check(str(tmp_path / "file"))
    (tmp_path / "empty" / "config.json").write_text("{}")
    check(str(tmp_path / "empty"))
    check("Qwen/Qwen2.5-7B-Instruct")  # a hub id is not checked


def test_sglang_needs_open_endpoint_when_the_key_is_generated(tmp_path: Path) -> None:
    cfg = golden_cfg().model_copy(
        update={"model": "org/m", "engine": golden_cfg().engine.model_copy(update={"kind": "sglang"})}
    )
    with pytest.raises(ConfigError, match="open_endpoint"):
        SlurmServing(cfg, SwarmPaths(tmp_path)).validate(cfg)
    opened = golden_cfg(open_endpoint=True).model_copy(
        update={"model": "org/m", "engine": golden_cfg().engine.model_copy(update={"kind": "sglang"})}
    )
    SlurmServing(opened, SwarmPaths(tmp_path)).validate(opened, ask=False)  # a site config: Slurm not asked


def test_golden_shard_job_in_its_own_allocation() -> None:
    jobs = {"cpus": 2, "mem": "4G", "partition": "cpu", "time_limit": "02:00:00"}
    cfg = golden_cfg(jobs=jobs)
    argv = render.shard_job_argv(
        cfg,
        name="psw-golden.job-1-0-abc",
        log=Path("/shared/psw/swarms/golden/jobs/job-1/logs/shard-00000.log"),
        workdir=Path("/shared/psw/swarms/golden/jobs/job-1"),
        command=["/opt/venv/bin/python", "-m", "prefect_swarm.jobs.run", "--spec", "/x/spec.json"],
    )
    check_golden("none/shard-job.argv", "\n".join(argv) + "\n")
    assert "--partition=cpu" in argv and "--signal=B:USR1@300" in argv and "--open-mode=append" in argv
    assert argv[-1] == "--wrap=exec /opt/venv/bin/python -m prefect_swarm.jobs.run --spec /x/spec.json"
    # backend.jobs unset: a job of more shards than the LB job hosts gets one CPU per shard, the LB's partition
    plain = render.shard_job_argv(golden_cfg(), name="n", log=Path("/l"), workdir=Path("/w"), command=["x"])
    assert "--cpus-per-task=1" in plain and not any(a.startswith("--mem=") for a in plain)


def test_shards_beyond_what_the_lb_job_hosts_run_in_their_own_allocations() -> None:
    cfg = golden_cfg()
    sc = render.slurm_section(cfg)
    slots = sc.lb.cpus * sc.lb.steps_per_cpu
    assert render.step_slots(cfg) == slots and slots >= 1
    assert not render.shards_as_jobs(cfg, slots) and render.shards_as_jobs(cfg, slots + 1)
    assert f"up to {slots} shards" in render.shard_placement(cfg)
    with_jobs = golden_cfg(jobs={"cpus": 2})
    assert render.step_slots(with_jobs) == 0 and render.shards_as_jobs(with_jobs, 1)
    assert render.shard_placement(with_jobs).startswith("every shard")


def test_the_slurm_example_shows_the_lb_and_site_settings() -> None:
    from prefect_swarm.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "slurm.yaml")
    sc = render.slurm_section(cfg)
    assert sc.lb.partition == "cpu" and sc.lb.cpus == 4 and sc.run_dir == "/shared/prefect-swarm"
    plan = render.render_plan(cfg)
    assert "#SBATCH --partition=cpu\n" in plan["lb.sbatch"] and "#SBATCH --mem=8G\n" in plan["lb.sbatch"]
    assert "#SBATCH --chdir=/shared/prefect-swarm/swarms/qwen-7b\n" in plan["replicas.sbatch"]


def test_the_generated_key_is_private_stable_and_only_for_closed_swarms(tmp_path: Path) -> None:
    from prefect_swarm.backends.slurm import identity

    paths = SwarmPaths(tmp_path / "s")
    cfg = golden_cfg()
    assert identity.with_key(cfg, paths).api_key is None  # reading never creates it
    keyed = identity.with_key(cfg, paths, create=True)
    assert keyed.api_key is not None and stat.S_IMODE(paths.api_key_file.stat().st_mode) == 0o600
    assert identity.with_key(cfg, paths).api_key == keyed.api_key  # the next process reads the same key
    assert identity.with_key(golden_cfg(open_endpoint=True), paths).api_key is None
    own = SwarmConfig.model_validate({**cfg.model_dump(), "api_key": "sk-mine"})
    assert identity.with_key(own, paths, create=True) is own
    paths.api_key_file.chmod(0o644)
    with pytest.raises(ConfigError, match="can be read by other users"):
        identity.with_key(cfg, paths)


def test_only_a_multi_node_backend_takes_a_replica_larger_than_a_node(tmp_path: Path) -> None:
    from prefect_swarm.backends.registry import build_backends
    from prefect_swarm.interfaces.capabilities import check_config

    local = SwarmConfig.model_validate({"name": "x", "model": "m", "gpus_per_replica": 4, "gpus_per_node": 2})
    with pytest.raises(ConfigError, match=r"gpus_per_replica=4 over gpus_per_node=2 .*needs multi_node"):
        check_config(local, build_backends(local, SwarmPaths(tmp_path)).serving.capabilities())
    slurm = multi_node_cfg()
    check_config(slurm, SlurmServing(slurm, SwarmPaths(tmp_path)).capabilities())  # Slurm has it


@pytest.mark.parametrize("nodes", [1, 2])
def test_golden_plan_with_stage(nodes: int) -> None:
    """``stage`` runs the stager before the engine (on every node of a multi-node replica) and points
    the engine at the staged copy; the served name stays the configured one."""
    base = golden_cfg() if nodes == 1 else multi_node_cfg(parallel={"tensor": 4, "pipeline": 2})
    data = base.model_dump(by_alias=True) | {"stage": {"to": "/local/models"}}
    cfg = SwarmConfig.model_validate(data)
    plan = render.render_plan(cfg)
    script, spec = plan["replicas.sbatch"], json.loads(plan["watchdog-1.json"])
    check_golden(f"stage/replicas-{nodes}node.sbatch", script)
    check_golden(f"stage/watchdog-1-{nodes}node.json", plan["watchdog-1.json"])
    staged = cfg.staged_model
    assert staged is not None and staged.startswith("/local/models/llama-8b-")
    argv = spec["argv"]
    assert argv[argv.index("--model") + 1] == staged and argv[argv.index("--served-model-name") + 1] == "llama"
    stage_line = f"-m prefect_swarm.sidecar.stage --from /models/llama-8b --to {staged}"
    assert stage_line in script
    engine_start = script.index('run_replica "$i" "$slot" &' if nodes == 1 else "sidecar.watchdog --spec")
    assert script.index(stage_line) < engine_start
    if nodes > 1:  # every other node stages in a step of its own, before Ray starts
        assert script.index('on_node "${HOSTS[r]}" "$PYTHON" -m prefect_swarm.sidecar.stage') < script.index(
            "start --head"
        )
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_stage_needs_a_model_directory() -> None:
    data = golden_cfg().model_dump(by_alias=True) | {"model": "meta-llama/Llama-3-8B", "stage": {"to": "/local"}}
    with pytest.raises(ValueError, match=r"set stage\.from"):
        SwarmConfig.model_validate(data)
    with pytest.raises(ValueError, match="absolute path"):
        SwarmConfig.model_validate(data | {"stage": {"to": "local", "from": "/m"}})


@pytest.mark.parametrize(
    ("kind", "port_range", "refused"),
    [
        ("vllm", "15000-15999", True),  # inside Ray's worker ports: every start would fail the same way
        ("vllm", "9000-10002", True),  # touches them
        ("vllm", "20000-20999", False),
        ("sglang", "15000-15999", False),  # no Ray
    ],
)
def test_a_ray_replicas_port_range_among_rays_worker_ports_is_refused_by_validate(
    kind: str, port_range: str, refused: bool, tmp_path: Path
) -> None:
    data = multi_node_cfg("none", kind).model_dump(by_alias=True)
    data["backend"] |= {"port_range": port_range, "run_dir": str(tmp_path / "run"), "open_endpoint": True}
    data["model"] = "org/tiny-model"  # a Hugging Face id: no model folder to find on this host
    cfg = SwarmConfig.model_validate(data)
    serving = SlurmServing(cfg, SwarmPaths(tmp_path / "s"))
    if not refused:
        serving.validate(cfg, ask=False)
        return
    with pytest.raises(ConfigError, match=rf"backend.port_range {port_range} overlaps the ports Ray's workers use"):
        serving.validate(cfg, ask=False)
