"""Pure functions: a SwarmConfig -> the text of every file the Slurm backend submits or runs.

Nothing here touches the scheduler or the disk; :func:`render_plan` is what
``prefect-swarm validate`` prints for a dry run. Quoting rules:

* every config value that reaches a shell line goes through :func:`shlex.quote`;
* ``#SBATCH`` lines are parsed by sbatch itself, which understands shell-style quotes but not
  newlines: a value with a control character is refused (ConfigError) before anything is submitted;
* ``backend.setup`` is shell by design and is written verbatim (it is the user's own script);
* secrets never reach a rendered file: they travel in the sbatch/srun process environment.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from prefect_swarm.backends.engine import (
    engine_argv,
    engine_env,
    engine_python,
    nodes_per_replica,
    parallel_sizes,
    uses_ray,
)
from prefect_swarm.config import ContainerConfig, SlurmConfig
from prefect_swarm.config.backends import SlurmJobsConfig
from prefect_swarm.config.base import ENV_NAME
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.interfaces.jobenv import API_KEY, BEARER_TOKEN, HOME, LOG_LEVEL
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.sidecar import key_guard

if TYPE_CHECKING:
    from prefect_swarm.config import SwarmConfig

HOST_TOKEN = "@PSW_HOST@"
"""Stands for the replica's bind address in watchdog specs; the replica script substitutes it."""

RANK_TOKEN = "@PSW_NODE_RANK@"
"""Stands for a node's rank in the argv of a multi-node SGLang replica's other nodes."""

DIST_PORT_TOKEN = "@PSW_DIST_PORT@"
"""Stands for the port of a multi-node SGLang replica's ``--dist-init-addr``; picked free on rank 0."""

RAY_MODULE = "ray.scripts.scripts"
"""``python -m ray.scripts.scripts`` is the ``ray`` CLI of the engine's interpreter (no PATH lookup)."""

RAY_WORKER_PORTS = (10002, 19999)
"""The ports Ray's workers listen on (``ray start``'s ``--min-worker-port``/``--max-worker-port``
defaults): Ray refuses to start when a port it was told to use falls among them."""

PORT_TOKEN = "@PSW_PORT@"
"""Stands for the replica's port in watchdog specs; the watchdog picks a free one at each start
(``port + index`` when free) and publishes it in the status file, the script in the head file."""

JOB_PREFIX = "psw-"
"""Every Slurm job and step we submit is named ``psw-...`` (and only those are ever cancelled by name)."""

NGINX_WORKERS = 2
"""nginx worker processes: one proxies tens of thousands of requests/s; two give headroom."""

NEEDED_EXPORT = (HOME, LOG_LEVEL, API_KEY, "VLLM_API_KEY")
"""Variables of the submitting process every job gets whatever ``backend.export`` says: the home and
log level, and the API key under the names the engines read (values travel in the sbatch process
environment, never in a script)."""

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
"""Set for the replicas unless ``backend.hf_offline`` is false: compute nodes usually have no internet."""

KEY_GUARD = "psw_key_guard.KeyGuard"
"""vLLM ``--middleware`` of a closed replica: every route needs the key (prefect_swarm.sidecar.key_guard)."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE)


@dataclass(frozen=True)
class JobNames:
    """Slurm job names of one swarm."""

    replicas: str
    lb: str

    shard_prefix: str
    """Start of the name of every shard job (``backend.jobs``): ``psw-<swarm>.`` (a swarm name has no dot)."""

    def all(self) -> list[str]:
        """Both names."""
        return [self.replicas, self.lb]


def slurm_section(cfg: SwarmConfig) -> SlurmConfig:
    """``cfg.backend`` as a SlurmConfig, or ConfigError."""
    if not isinstance(cfg.backend, SlurmConfig):
        raise ConfigError(f"the Slurm backend needs backend.type 'slurm', not '{cfg.backend.type}'.")
    return cfg.backend


def job_names(cfg: SwarmConfig) -> JobNames:
    """``psw-<swarm>-replicas`` and ``psw-<swarm>-lb``."""
    return JobNames(f"{JOB_PREFIX}{cfg.name}-replicas", f"{JOB_PREFIX}{cfg.name}-lb", f"{JOB_PREFIX}{cfg.name}.")


def swarm_paths(cfg: SwarmConfig, paths: SwarmPaths | None = None) -> SwarmPaths:
    """The swarm folder (its run dir): under ``backend.run_dir`` when set (every node must see it), else ``paths``."""
    if slurm_section(cfg).run_dir:
        return SwarmPaths.of(cfg.name, cfg.run_dir)
    return paths or SwarmPaths.of(cfg.name, None)


def closed(cfg: SwarmConfig) -> bool:
    """True when the swarm's endpoint needs a key: ``api_key`` set, or generated (no ``backend.open_endpoint``)."""
    return cfg.api_key is not None or not slurm_section(cfg).open_endpoint


def key_guarded(cfg: SwarmConfig) -> bool:
    """True when the replicas run vLLM behind :data:`KEY_GUARD` (a closed vLLM swarm)."""
    return closed(cfg) and cfg.engine.kind == "vllm"


def check_ray_ports(cfg: SwarmConfig) -> None:
    """ConfigError when a replica spanning nodes runs Ray and ``backend.port_range`` overlaps Ray's worker
    ports: the head's port is picked in the range, and Ray refuses a port among its workers' (every
    start of the replica would fail the same way)."""
    ports = slurm_section(cfg).ports
    low, high = RAY_WORKER_PORTS
    if uses_ray(cfg) and ports and ports[0] <= high and ports[1] >= low:
        raise ConfigError(
            f"backend.port_range {ports[0]}-{ports[1]} overlaps the ports Ray's workers use ({low}-{high}); a "
            f"replica spanning nodes forms a Ray cluster whose head port is picked in port_range, and Ray refuses "
            f"one among its workers'. Pick a range outside {low}-{high} (e.g. 20000-20999)."
        )


def check_api_key(cfg: SwarmConfig) -> None:
    """ConfigError when ``api_key`` is not a bearer token (RFC 6750): no client could send it as one,
    and the LB's check holds it verbatim."""
    if cfg.api_key is not None and not BEARER_TOKEN.match(cfg.api_key.get_secret_value()):
        raise ConfigError(
            "api_key holds a character a bearer token cannot (allowed: letters, digits and - . _ ~ + / "
            "with = only at the end). Use such a key, e.g. `python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'`, or leave api_key unset for a generated one."
        )


HOST_WAIT_S = 300
"""Seconds a task of a swarm with ``backend.share_allocation_of`` waits for its host's task to run (one
being replaced) before it gives up."""


def check_shared_allocation(cfg: SwarmConfig) -> None:
    """ConfigError, before anything is submitted, when ``backend.share_allocation_of`` names no swarm whose
    allocation this one's replicas can run in: it must be another Slurm swarm of the same run dir that is
    up (its record), not itself a guest, with sleep mode on both sides, a task for each of this swarm's
    tasks, the same replicas per task, and at least the GPUs this swarm's replicas use."""
    sc = slurm_section(cfg)
    host = sc.share_allocation_of
    if not host:
        return
    field = f"backend.share_allocation_of '{host}'"
    if host == cfg.name:
        raise ConfigError(f"{field} names this swarm itself; name the swarm whose allocation it runs in.")
    if not cfg.engine.sleep_mode or nodes_per_replica(cfg) > 1:
        raise ConfigError(
            f"{field}: the swarms take turns on the same GPUs, so this one needs engine.sleep_mode: true and "
            "replicas of one node each."
        )
    if sc.container.runtime == "pyxis":
        raise ConfigError(
            f"{field}: pyxis starts the engine in an srun step of its own, which cannot run inside the step "
            "this swarm's replicas run in. Use container.runtime apptainer, singularity or none."
        )
    host_paths = SwarmPaths.of(host, sc.run_dir)
    record = json.loads(host_paths.slurm_record.read_text()) if host_paths.slurm_record.exists() else {}
    host_cfg = _config_as_brought_up(host_paths)
    if host_cfg is None or not record.get("array_tasks"):
        raise ConfigError(
            f"{field}: no Slurm swarm of that name is up in {host_paths.root.parent}. Bring it up first "
            f"(`prefect-swarm up`), with the same backend.run_dir as this swarm."
        )
    if not isinstance(host_cfg.backend, SlurmConfig) or host_cfg.backend.share_allocation_of:
        raise ConfigError(f"{field} is not a Slurm swarm with an allocation of its own; name one that is.")
    if not host_cfg.engine.sleep_mode:
        raise ConfigError(
            f"{field} runs without engine.sleep_mode, so its replicas cannot give up the GPUs to this swarm's. "
            f"Bring it up with engine.sleep_mode: true."
        )
    host_per = int(record.get("per_task") or 1)
    host_gpus = host_cfg.gpus_per_replica * host_per
    if array_tasks(cfg) > int(record["array_tasks"]) or per_task(cfg) != host_per:
        raise ConfigError(
            f"{field} runs {record['array_tasks']} task(s) of {host_per} replica(s); this swarm needs "
            f"{array_tasks(cfg)} of {per_task(cfg)}. Give it at most as many replicas, "
            f"{host_per} per node (replicas_per_node)."
        )
    if cfg.gpus_per_replica * per_task(cfg) > host_gpus:
        raise ConfigError(
            f"{field} holds {host_gpus} GPU(s) per task; this swarm's replicas need "
            f"{cfg.gpus_per_replica * per_task(cfg)}. Lower gpus_per_replica."
        )


def _config_as_brought_up(paths: SwarmPaths) -> SwarmConfig | None:
    """The config a swarm was brought up with (its redacted copy), or None when there is none to read."""
    import yaml
    from pydantic import ValidationError

    from prefect_swarm.config import SwarmConfig

    try:
        return SwarmConfig.model_validate(yaml.safe_load(paths.config.read_text()))
    except (OSError, yaml.YAMLError, ValidationError):
        return None


def job_python(cfg: SwarmConfig) -> str:
    """Python on the compute nodes (job steps, reconciler, watchdog): ``backend.job_python`` or this one."""
    return slurm_section(cfg).job_python or sys.executable


def array_tasks(cfg: SwarmConfig) -> int:
    """Array tasks the replicas need: one per ``replicas_per_node`` replicas (one per replica when a
    replica spans several nodes)."""
    return -(-cfg.replicas // per_task(cfg))


def per_task(cfg: SwarmConfig) -> int:
    """Replicas each array task runs."""
    if nodes_per_replica(cfg) > 1:
        return 1
    return min(cfg.effective_replicas_per_node, cfg.replicas)


# ---------------------------------------------------------------------------------- quoting
def q(value: object) -> str:
    """Shell-quote one value."""
    return shlex.quote(str(value))


def sbatch_value(field: str, value: object) -> str:
    """A value for an ``#SBATCH`` line: shell-quoted, and refused if it holds a control character."""
    text = str(value)
    if _CONTROL.search(text):
        raise ConfigError(
            f"{field} contains a control character (newline, tab...): {text!r}. "
            "sbatch reads #SBATCH options line by line; remove it."
        )
    return shlex.quote(text)


def env_lines(env: dict[str, str], field: str) -> list[str]:
    """``export K=V`` lines, names checked, values quoted."""
    lines = []
    for key, value in env.items():
        if not ENV_NAME.match(key):
            raise ConfigError(f"{field}: '{key}' is not a valid environment variable name.")
        lines.append(f"export {key}={q(value)}")
    return lines


# ---------------------------------------------------------------------------------- sbatch options
def _common_options(
    sc: SlurmConfig,
    *,
    partition: str | None,
    account: str | None,
    qos: str | None,
    time_limit: str,
    prefix: str = "backend.",
) -> list[str]:
    opts = [f"--time={sbatch_value(prefix + 'time_limit', time_limit)}"]
    for flag, field, value in (
        ("--partition", "partition", partition),
        ("--account", "account", account),
        ("--qos", "qos", qos),
        ("--reservation", "reservation", sc.reservation),
        ("--constraint", "constraint", sc.constraint),
    ):
        if value:
            opts.append(f"{flag}={sbatch_value('backend.' + field, value)}")
    # Without "B:" every job step gets the signal (job steps flush their ledger) and the batch
    # step does not (an engine would die of an unexpected SIGUSR1).
    if sc.signal_seconds:
        opts.append(f"--signal=USR1@{sc.signal_seconds}")
    opts.append("--requeue" if sc.requeue else "--no-requeue")
    return opts


def _output_options(paths: SwarmPaths, job: str, pattern: str) -> list[str]:
    """The batch step's stdout and stderr, in two files a site's tools can tell apart."""
    return [
        f"--{option}={sbatch_value('backend.run_dir', paths.batch_output(job, pattern, stream))}"
        for option, stream in (("output", "out"), ("error", "err"))
    ]


def file_options(cfg: SwarmConfig, paths: SwarmPaths) -> list[str]:
    """``--chdir`` (the run dir), ``--open-mode=append`` (a requeued task adds to its log instead of
    truncating it) and ``--export`` (``backend.export`` plus :data:`NEEDED_EXPORT`, or ALL)."""
    sc = slurm_section(cfg)
    if sc.export_all:
        export = "ALL"
    else:
        names = list(dict.fromkeys([*sc.export, *NEEDED_EXPORT]))
        bad = [n for n in names if not ENV_NAME.match(n)]
        if bad:
            raise ConfigError(f"backend.export: {bad} are not environment variable names.")
        export = ",".join(names)
    return [
        f"--chdir={sbatch_value('backend.run_dir', paths.root)}",
        "--open-mode=append",
        f"--export={export}",
    ]


def _mem(value: str, times: int, field: str = "backend.mem_per_replica") -> str:
    match = _MEM.match(value.strip())
    if not match:
        raise ConfigError(f"{field} '{value}' is not a Slurm size like 64G or 512M.")
    return f"{int(match.group(1)) * times}{match.group(2).upper()}"


def replicas_options(cfg: SwarmConfig, paths: SwarmPaths) -> list[str]:
    """``#SBATCH`` options of the replica array job."""
    sc = slurm_section(cfg)
    n_per = per_task(cfg)
    check_gpu_layout(cfg)
    nodes = nodes_per_replica(cfg)
    opts = [
        f"--job-name={job_names(cfg).replicas}",
        f"--array=0-{array_tasks(cfg) - 1}",
        f"--nodes={nodes}",
        "--ntasks=1" if nodes == 1 else "--ntasks-per-node=1",
    ]
    cpus, *gpus_mem = task_resources(cfg, n_per)
    opts += [cpus, *_output_options(paths, "replicas", "%A_%a")]
    opts += gpus_mem
    opts += file_options(cfg, paths)
    opts += _common_options(sc, partition=sc.partition, account=sc.account, qos=sc.qos, time_limit=sc.time_limit)
    opts += [sbatch_value("backend.sbatch_args", arg) for arg in sc.sbatch_args]
    return opts


def task_resources(cfg: SwarmConfig, replicas: int) -> list[str]:
    """``--cpus-per-task``, ``--gres`` and ``--mem`` of an array task that runs ``replicas`` replicas.

    The script asks for a full task (``per_task`` replicas); a last task that runs fewer is
    submitted with these on the sbatch command line (they override the script's), so it asks for
    what it runs: 3 replicas of 2 GPUs on 4-GPU nodes are tasks of ``gpu:4`` and ``gpu:2``. A replica
    spanning several nodes asks for these on each node (every GPU of the node).
    """
    sc = slurm_section(cfg)
    if sc.share_allocation_of:  # the replicas run in the other swarm's task: this one only holds the step
        return ["--cpus-per-task=1"]
    opts = [f"--cpus-per-task={sc.cpus_per_replica * replicas}"]
    gpus = cfg.gpus_per_replica * replicas
    if nodes_per_replica(cfg) > 1 and cfg.gpus_per_node:
        gpus = cfg.gpus_per_node
    if cfg.gpus_per_replica:
        opts.append(f"--gres={sbatch_value('backend.gres_name', sc.gres_name)}:{gpus}")
    if sc.mem_per_replica:
        opts.append(f"--mem={_mem(sc.mem_per_replica, replicas)}")
    return opts


MULTI_NODE_RUNTIMES = ("none", "apptainer", "singularity")
"""Container runtimes a replica spanning several nodes can run in (pyxis wraps every command in an srun
step of its own, which does not nest in the per-node steps)."""


def check_gpu_layout(cfg: SwarmConfig) -> None:
    """ConfigError for a GPU layout no allocation can hold: a replica larger than a node must take whole
    nodes (:func:`nodes_per_replica`), ``engine.parallel`` must multiply to ``gpus_per_replica``."""
    nodes = nodes_per_replica(cfg)
    parallel_sizes(cfg)
    runtime = slurm_section(cfg).container.runtime
    if nodes > 1 and runtime not in MULTI_NODE_RUNTIMES:
        raise ConfigError(
            f"gpus_per_replica ({cfg.gpus_per_replica}) over gpus_per_node ({cfg.gpus_per_node}) makes each "
            f"replica span {nodes} nodes, which backend.container.runtime '{runtime}' does not support; "
            f"use one of {', '.join(MULTI_NODE_RUNTIMES)}."
        )


def lb_options(cfg: SwarmConfig, paths: SwarmPaths) -> list[str]:
    """``#SBATCH`` options of the load-balancer job (one task, ``backend.lb`` resources, no GPU)."""
    sc = slurm_section(cfg)
    lb = sc.lb
    opts = [
        f"--job-name={job_names(cfg).lb}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={lb.cpus}",
        *_output_options(paths, "lb", "%j"),
    ]
    if lb.mem:
        opts.append(f"--mem={_mem(lb.mem, 1, 'backend.lb.mem')}")
    opts += file_options(cfg, paths)
    opts += _common_options(
        sc,
        partition=lb.partition or sc.lb_partition or sc.partition,
        account=lb.account or sc.account,
        qos=lb.qos or sc.qos,
        time_limit=lb.time_limit or sc.time_limit,
        prefix="backend.lb." if lb.time_limit else "backend.",
    )
    return opts


# ---------------------------------------------------------------------------------- containers
def container_prefix(container: ContainerConfig, *, in_step: bool = False) -> list[str]:
    """argv placed before a command so it runs in the container (empty for runtime 'none').

    apptainer/singularity: ``apptainer exec [--nv] [-B m]... [extra] IMAGE``. pyxis:
    ``srun --overlap --ntasks=1 --container-image=IMAGE [--container-mounts=a,b] [extra]`` inside the
    batch script; inside a job step (``in_step``) pyxis flags go on the step's own srun instead
    (:func:`pyxis_flags`), so the prefix is empty.
    """
    if container.runtime == "none":
        return []
    image = _container_image(container)
    if container.runtime in ("apptainer", "singularity"):
        argv = [container.runtime, "exec"]
        if container.nv:
            argv.append("--nv")
        for mount in container.mounts:
            argv += ["-B", mount]
        return [*argv, *container.extra_args, image]
    if in_step:
        return []
    return ["srun", "--overlap", "--ntasks=1", *pyxis_flags(container)]


def pyxis_flags(container: ContainerConfig) -> list[str]:
    """srun flags of the pyxis plugin for ``container`` (empty unless runtime is pyxis)."""
    if container.runtime != "pyxis":
        return []
    flags = [f"--container-image={_container_image(container)}"]
    if container.mounts:
        if any("," in m for m in container.mounts):
            raise ConfigError("backend.container.mounts: pyxis joins mounts with ',', so a mount may not contain one.")
        flags.append("--container-mounts=" + ",".join(container.mounts))
    return [*flags, *container.extra_args]


def _container_image(container: ContainerConfig) -> str:
    if not container.image:
        raise ConfigError(f"backend.container.runtime '{container.runtime}' needs backend.container.image.")
    return container.image


# ---------------------------------------------------------------------------------- files
@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("prefect_swarm.backends.slurm", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        # bash uses "{#" (${#ARRAY[@]}): give jinja comments a marker shell never writes
        comment_start_string="{{#",
        comment_end_string="#}}",
    )


def _template(template: str, **values: object) -> str:
    return _env().get_template(template).render(**values)


def _setup(sc: SlurmConfig) -> str:
    """``backend.setup`` verbatim between an ERR trap and its removal: the first line that fails
    calls the script's ``setup_failed CODE LINE``, which stops the job with that line as the reason
    (a line meant to fail may say ``|| true``)."""
    if not sc.setup:
        return ""
    return "\n".join(["trap 'setup_failed $? $LINENO' ERR; SETUP_LINE0=$LINENO", *sc.setup, "trap - ERR"])


def watchdog_spec(cfg: SwarmConfig, paths: SwarmPaths, index: int) -> dict[str, object]:
    """The watchdog spec of replica ``index`` (JSON; the bind address is :data:`HOST_TOKEN`, the port
    :data:`PORT_TOKEN`, picked free at each start with ``port + index`` preferred)."""
    sc = slurm_section(cfg)
    argv = [*container_prefix(sc.container), *engine_argv(cfg, host=HOST_TOKEN, port=PORT_TOKEN, **_dist(cfg))]
    if key_guarded(cfg):
        argv += ["--middleware", KEY_GUARD]
    env = _replica_env(cfg)
    extra: dict[str, object] = {}
    if nodes_per_replica(cfg) > 1:
        extra["peers_file"] = str(paths.root / f"replica-{index}.peers")
    if sc.port_range:
        extra["port_range"] = list(sc.ports or ())
    return {
        **extra,
        "swarm": cfg.name,
        "root": str(paths.root),
        "index": index,
        "argv": argv,
        "url": f"http://{HOST_TOKEN}:{PORT_TOKEN}",
        "port_token": PORT_TOKEN,
        "preferred_port": cfg.port + index,
        "env": env,
        "health_path": cfg.engine.health_path,
        "startup_timeout_s": cfg.engine.startup_timeout_s,
        "wall_time_s": None,
    }


def _replica_env(cfg: SwarmConfig) -> dict[str, str]:
    sc = slurm_section(cfg)
    env = {**(OFFLINE_ENV if sc.hf_offline else {}), **engine_env(cfg)}  # the user's env wins
    env_lines(env, "env / engine.env")  # validates the names
    return env


def _dist(cfg: SwarmConfig, rank: int | str = 0) -> dict[str, str]:
    """engine_argv's multi-node SGLang arguments (rank, head address) as tokens the script fills in."""
    if nodes_per_replica(cfg) > 1 and cfg.engine.kind == "sglang":
        return {"node_rank": str(rank), "dist_init_addr": f"{HOST_TOKEN}:{DIST_PORT_TOKEN}"}
    return {}


def _words(argv: Sequence[str]) -> str:
    """A bash array body: each word shell-quoted."""
    return " ".join(q(word) for word in argv)


def _multi_node(cfg: SwarmConfig, paths: SwarmPaths) -> dict[str, object]:
    """Template values of a replica spanning several nodes (empty dict for a single-node replica)."""
    nodes = nodes_per_replica(cfg)
    if nodes == 1:
        return {"nodes": 1}
    sc = slurm_section(cfg)
    prefix = container_prefix(sc.container)
    python = [*prefix, engine_python(cfg)]
    values: dict[str, object] = {
        "nodes": nodes,
        "ray": uses_ray(cfg),
        "ray_cmd": _words([*python, "-m", RAY_MODULE]),
        "ray_py": _words(python),
        "ray_wait_s": int(cfg.engine.startup_timeout_s),
        "ray_token": q(paths.ray_token_file),
        "config_file": str(paths.config),
        "node_tmp": q(sc.node_tmp),
        "rank_token": RANK_TOKEN,
        "dist_port_token": DIST_PORT_TOKEN,
        "port_token": PORT_TOKEN,
        "peer_argv": "",
        "peer_env": "",
    }
    if not uses_ray(cfg):
        peer = engine_argv(cfg, host=HOST_TOKEN, port=PORT_TOKEN, **_dist(cfg, RANK_TOKEN))
        values["peer_argv"] = _words([*prefix, *peer])
        values["peer_env"] = _words([f"{k}={v}" for k, v in _replica_env(cfg).items()])
    return values


STAGE_MODULE = "prefect_swarm.sidecar.stage"
"""Run with the job python on each node of a replica before its engine when ``stage`` is set."""


def _stage(cfg: SwarmConfig) -> dict[str, object]:
    """Template values of ``stage``: the argv (after ``$PYTHON``) that stages the model on a node."""
    if cfg.stage_source is None or cfg.staged_model is None:
        return {"stage": ""}
    return {"stage": _words(["-m", STAGE_MODULE, "--from", cfg.stage_source, "--to", cfg.staged_model])}


def render_replicas(cfg: SwarmConfig, paths: SwarmPaths) -> str:
    """The replica array job script."""
    sc = slurm_section(cfg)
    return _template(
        "replicas.sbatch.j2",
        **_multi_node(cfg, paths),
        **_stage(cfg),
        stage_log=q(paths.stage_log),
        name=cfg.name,
        replicas=cfg.replicas,
        per_task=per_task(cfg),
        sbatch_options=replicas_options(cfg, paths),
        swarm_dir=q(paths.root),
        python=q(job_python(cfg)),
        gpus_per_replica=cfg.gpus_per_replica,
        host_token=HOST_TOKEN,
        lb_job_name=q(job_names(cfg).lb),
        port_range=q(sc.port_range) if sc.port_range else "",
        replicas_job_name=q(job_names(cfg).replicas),
        host=sc.share_allocation_of or "",
        host_wait_s=HOST_WAIT_S,
        host_job_name=q(f"{JOB_PREFIX}{sc.share_allocation_of}-replicas") if sc.share_allocation_of else "",
        replicas_script=q(paths.replicas_script),
        setup=_setup(sc),
        key_guard_dir=q(paths.engine_path_dir) if key_guarded(cfg) else "",
    )


def render_lb(cfg: SwarmConfig, paths: SwarmPaths) -> str:
    """The load-balancer job script."""
    sc = slurm_section(cfg)
    return _template(
        "lb.sbatch.j2",
        name=cfg.name,
        sbatch_options=lb_options(cfg, paths),
        swarm_dir=q(paths.root),
        python=q(job_python(cfg)),
        nginx_bin=q(sc.nginx_bin),
        lb_dir=q(paths.lb_dir),
        lb_failed=q(paths.lb_failed),
        port=sc.lb_port,
        idle_timeout=f"{sc.idle_timeout_s:g}" if sc.idle_timeout_s else "",
        idle_park=sc.idle_action == "park",
        budget=q(sc.cost.model_dump_json()) if sc.cost.capped else "",
        gres_name=q(sc.gres_name),
        port_range=q(sc.port_range) if sc.port_range else "",
        replicas_job_name=q(job_names(cfg).replicas),
        setup=_setup(sc),
    )


def _nginx_path(path: Path) -> str:
    text = str(path)
    if re.search(r"[\s;{}\"'#$\\]", text) or _CONTROL.search(text):
        raise ConfigError(
            f"swarm folder '{text}' holds a character nginx config cannot take unquoted "
            "(space ; { } quotes # $ \\). "
            f"Set backend.run_dir (or {HOME}) to a plainer path."
        )
    return text


def render_nginx(cfg: SwarmConfig, paths: SwarmPaths) -> str:
    """nginx.conf of the LB."""
    sc = slurm_section(cfg)
    timeout = max(1, int(-(-sc.proxy_timeout_s // 1)))
    return _template(
        "nginx.conf.j2",
        name=cfg.name,
        workers=NGINX_WORKERS,
        lb_dir=_nginx_path(paths.lb_dir),
        upstreams=_nginx_path(paths.upstreams),
        proxy_timeout=timeout,
    )


def render_files(cfg: SwarmConfig, paths: SwarmPaths | None = None) -> dict[Path, str]:
    """Every file ``up`` writes, path -> text; submits nothing, writes nothing.

    ``replicas.sbatch``, ``lb.sbatch``, ``nginx.conf`` and one ``watchdog-<i>.json`` per replica.
    """
    sp = swarm_paths(cfg, paths)
    files = {
        sp.replicas_script: render_replicas(cfg, sp),
        sp.lb_script: render_lb(cfg, sp),
        sp.nginx_conf: render_nginx(cfg, sp),
    }
    for i in range(cfg.replicas):
        files[sp.watchdog_spec(i)] = json.dumps(watchdog_spec(cfg, sp, i), indent=2, sort_keys=True) + "\n"
    if key_guarded(cfg):
        files[sp.key_guard_module] = Path(key_guard.__file__).read_text()
    return files


def render_plan(cfg: SwarmConfig, paths: SwarmPaths | None = None) -> dict[str, str]:
    """:func:`render_files` by file name: what ``prefect-swarm validate`` prints."""
    return {path.name: text for path, text in render_files(cfg, paths).items()}


# ---------------------------------------------------------------------------------- job steps
def step_argv(cfg: SwarmConfig, *, jobid: str, step_name: str, command: Sequence[str]) -> list[str]:
    """``srun`` argv of one job step inside allocation ``jobid`` (raw id), container included.

    The environment is not on this line: srun gets it from its own process environment
    (``--export=ALL``), so values with commas, quotes or newlines arrive intact and secrets stay
    out of every printed command.
    """
    sc = slurm_section(cfg)
    argv = [
        "srun",
        f"--jobid={jobid}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--job-name={step_name}",
        "--export=ALL",
        "--kill-on-bad-exit=1",
        *pyxis_flags(sc.container),
    ]
    return [*argv, *container_prefix(sc.container, in_step=True), *command]


# ---------------------------------------------------------------------------------- shard jobs
def step_slots(cfg: SwarmConfig) -> int:
    """Shards of one job the LB job's allocation hosts as job steps (``backend.lb.cpus`` x
    ``steps_per_cpu``); 0 with ``backend.jobs`` set (every shard is an sbatch job of its own)."""
    sc = slurm_section(cfg)
    return 0 if sc.jobs is not None else sc.lb.cpus * sc.lb.steps_per_cpu


def shards_as_jobs(cfg: SwarmConfig, nshards: int) -> bool:
    """Whether a job of ``nshards`` shards runs each shard as an sbatch job of its own (see :func:`step_slots`)."""
    return nshards > step_slots(cfg)


def shard_placement(cfg: SwarmConfig) -> str:
    """Where a batch job's shards run on this swarm, in one sentence (``prefect-swarm validate`` prints it)."""
    sc = slurm_section(cfg)
    jobs = sc.jobs or SlurmJobsConfig()
    size = f"{jobs.cpus} CPU{'s' if jobs.cpus > 1 else ''}" + (f", {jobs.mem}" if jobs.mem else "")
    own = f"an sbatch job of its own ({size} each, backend.jobs)"
    if sc.jobs is not None:
        return f"every shard of a batch job runs as {own}."
    slots = step_slots(cfg)
    return (
        f"a batch job of up to {slots} shards (backend.lb.cpus {sc.lb.cpus} x backend.lb.steps_per_cpu "
        f"{sc.lb.steps_per_cpu}) runs them as job steps in the load balancer's allocation; a job of more "
        f"shards runs each shard as {own}."
    )


def shard_job_argv(cfg: SwarmConfig, *, name: str, log: Path, workdir: Path, command: Sequence[str]) -> list[str]:
    """``sbatch`` argv of one shard run as a job of its own (``backend.jobs``).

    The batch shell ``exec``s the job process (in its container), so ``--signal=B:USR1@N`` reaches
    it and it flushes its ledger before the time limit. The environment is sbatch's own process
    environment (``--export=ALL``): secrets appear in no command and no file. The log is appended
    to (``--open-mode=append``): a requeued shard keeps what it logged before.
    """
    sc = slurm_section(cfg)
    jobs = sc.jobs or SlurmJobsConfig()  # unset: a job of more shards than the LB hosts (see step_slots)
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={jobs.cpus}",
        f"--output={log}",
        "--open-mode=append",
        f"--chdir={workdir}",
        "--export=ALL",
    ]
    if jobs.mem:
        argv.append(f"--mem={_mem(jobs.mem, 1, 'backend.jobs.mem')}")
    argv.append(f"--time={jobs.time_limit or sc.time_limit}")
    for flag, value in (
        ("--partition", jobs.partition or sc.lb.partition or sc.lb_partition or sc.partition),
        ("--account", sc.lb.account or sc.account),
        ("--qos", sc.lb.qos or sc.qos),
        ("--reservation", sc.reservation),
    ):
        if value:
            argv.append(f"{flag}={value}")
    if sc.signal_seconds:
        argv.append(f"--signal=B:USR1@{sc.signal_seconds}")
    argv.append("--requeue" if sc.requeue else "--no-requeue")
    inner = [*container_prefix(sc.container), *command]
    if sc.container.runtime == "pyxis":
        inner = ["srun", "--ntasks=1", "--export=ALL", *pyxis_flags(sc.container), *command]
    return [*argv, "--wrap=exec " + shlex.join(inner)]
