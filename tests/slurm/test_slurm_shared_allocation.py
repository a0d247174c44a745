"""Two swarms on one Slurm allocation (``backend.share_allocation_of``), on the real single-node Slurm
with GPU-like simulator replicas in sleep mode: the second swarm's replicas run as ``srun --overlap``
steps inside the first swarm's replica task, the first sleeps while the second answers, and down
leaves nothing of either in the queue."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

import httpx
import pytest
import yaml
from _slurmkit import LiveSwarm, our_jobs, stub_config

from prefect_swarm.backends.slurm.serving import SlurmServing
from prefect_swarm.exceptions import ConfigError
from prefect_swarm.paths import SwarmPaths, atomic_write_text
from prefect_swarm.testing.gpu_sim import MODULE
from prefect_swarm.testing.stub_engine import engine_command
from prefect_swarm.testing.waiting import wait_until

SLEEPY = {"command": engine_command(module=MODULE, enable_sleep_mode=True, step_ms=5, wake_s=0.3), "sleep_mode": True}


def _steps() -> list[tuple[str, str]]:
    """(step id, step name) of every job step in the queue."""
    out = subprocess.run(["squeue", "-s", "-h", "-o", "%i %j"], capture_output=True, text=True, check=True).stdout
    return [(line.split()[0], line.split()[1]) for line in out.splitlines() if len(line.split()) == 2]


def _gpus(paths: SwarmPaths) -> str:
    """The GPUs replica 0 was started on, as its task's output says (``... gpus <CUDA_VISIBLE_DEVICES>``)."""
    text = "".join(f.read_text() for f in paths.root.glob("replicas-*.out"))
    found = re.findall(r"^replica 0: task \S+ node .* gpus (\S+)$", text, re.M)
    assert found, text
    return found[-1]


def _chat(url: str, key: str | None) -> httpx.Response:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_the_second_swarm_runs_in_the_first_ones_allocation_while_it_sleeps(
    slurm_swarm: Callable[..., LiveSwarm],
) -> None:
    first = slurm_swarm(stub_config(replicas=1, engine=SLEEPY))
    h1 = first.up()
    # what `up` keeps of the swarm it brought up, and the second swarm's check reads
    atomic_write_text(first.paths.config, yaml.safe_dump(first.cfg.redacted(), sort_keys=False))
    (host_task,) = [r.external_id for r in first.serving.status(h1).replicas]
    (slept,) = first.serving.sleep(h1, [0])
    assert slept.asleep

    second_cfg = stub_config(replicas=1, engine=SLEEPY, backend={"share_allocation_of": first.cfg.name})
    second = slurm_swarm(second_cfg)
    assert second.serving.validate(second_cfg, ask=False) == []
    h2 = second.up()
    status = second.serving.status(h2)
    assert status.url and status.healthy == 1, status
    in_host = [step for step, name in _steps() if name == f"psw-{second_cfg.name}-replicas"]
    assert [s.rsplit(".", 1)[0] for s in in_host] == [host_task], (in_host, host_task, _steps())  # one job id
    assert _chat(status.url, second.serving.client_key()).status_code == 200  # the second answers...
    gpus = {name: _gpus(swarm.paths) for name, swarm in (("first", first), ("second", second))}
    assert gpus["first"] == gpus["second"] != "none", gpus  # the same GPU, seen from both swarms' replicas
    replica = first.serving.status(h1).replicas[0]
    assert "asleep" in replica.detail, replica  # ...while the first sleeps in the same allocation

    # the host's task is replaced (here: cancelled; its LB resubmits it): the guest's step ends with it,
    # the guest's LB resubmits its task, which starts the step again in the host's new task
    subprocess.run(["scancel", host_task], check=True)
    wait_until(
        "the guest's replica back in the host's new task",
        lambda: [s.rsplit(".", 1)[0] for s, n in _steps() if n == f"psw-{second_cfg.name}-replicas"],
        until=lambda tasks: len(tasks) == 1 and tasks[0] != host_task,
        timeout_s=240,
    )
    host_task = first.serving.status(h1).replicas[0].external_id
    second.serving.wait_ready(h2, 120)
    assert _chat(status.url, second.serving.client_key()).status_code == 200

    second.down()
    assert our_jobs(second_cfg) == "" and not [n for _, n in _steps() if n == f"psw-{second_cfg.name}-replicas"]
    assert first.serving.status(h1).replicas[0].external_id == host_task  # the first keeps its allocation
    (woke,) = first.serving.wake(h1, [0])
    assert not woke.asleep
    first.down()
    assert our_jobs(first.cfg) == ""


def test_a_swarm_to_share_with_must_be_up_with_sleep_mode(slurm_swarm: Callable[..., LiveSwarm]) -> None:
    lonely = stub_config(replicas=1, engine=SLEEPY, backend={"share_allocation_of": "no-such-swarm"})
    with pytest.raises(ConfigError, match="no Slurm swarm of that name is up"):
        SlurmServing(lonely, SwarmPaths.for_swarm(lonely.name)).validate(lonely, ask=False)
    itself = stub_config(replicas=1, engine=SLEEPY, backend={"share_allocation_of": "x"}, name="x")
    with pytest.raises(ConfigError, match="names this swarm itself"):
        SlurmServing(itself, SwarmPaths.for_swarm("x")).validate(itself, ask=False)
    awake = slurm_swarm(stub_config(replicas=1))
    awake.up()
    atomic_write_text(awake.paths.config, yaml.safe_dump(awake.cfg.redacted(), sort_keys=False))
    guest = stub_config(replicas=1, engine=SLEEPY, backend={"share_allocation_of": awake.cfg.name})
    with pytest.raises(ConfigError, match=r"without engine\.sleep_mode"):
        SlurmServing(guest, SwarmPaths.for_swarm(guest.name)).validate(guest, ask=False)
    two = stub_config(replicas=2, engine=SLEEPY, backend={"share_allocation_of": awake.cfg.name})
    with pytest.raises(ConfigError, match=r"without engine\.sleep_mode"):
        slurm_swarm(two).up()
    assert our_jobs(two) == ""  # refused before anything was submitted
