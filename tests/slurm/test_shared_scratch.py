"""A swarm on a shared scratch with a second Unix user attacking (issue 35 item 1), on the real
single-node Slurm. The other user is ``nobody`` (:func:`prefect_swarm.testing.users.as_user`); the
scratch is a sticky 1777 folder, as a site's is.

- She makes ``<run_dir>/swarms/<name>`` first: the owner's `up` refuses it, submits nothing.
- The owner's swarm and its job leave nothing she may read or change (``find -perm /077`` lists
  nothing; her reads and writes are refused).
- A batch script changed behind the owner's back (as if she had got in) is never run: the LB's
  reconciler refuses to resubmit it, and the swarm stops saying why.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _slurmkit import job_command, make_job, our_jobs, output_ids, stub_config

from prefect_swarm.backends.slurm.client import SlurmClient
from prefect_swarm.backends.slurm.compute import SlurmCompute
from prefect_swarm.backends.slurm.serving import SlurmServing
from prefect_swarm.config import SwarmConfig
from prefect_swarm.exceptions import AccessError
from prefect_swarm.interfaces import JobRequest, JobStatus, ServingHandle
from prefect_swarm.paths import SwarmPaths, read_json
from prefect_swarm.swarm import Swarm
from prefect_swarm.testing.users import NOBODY, as_user
from prefect_swarm.testing.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing a second user needs root")


@pytest.fixture
def scratch(need_slurm: None) -> Iterator[Path]:
    """A shared scratch: 1777 and sticky, reachable by every user (unlike pytest's 0700 tmp folders)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="psw-scratch-"))
    base.chmod(0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def serving(scratch: Path) -> Iterator[Callable[[SwarmConfig], SlurmServing]]:
    """Factory of Slurm swarms whose run_dir is the scratch; each one made is deleted after the test."""
    made: list[tuple[SlurmServing, SwarmConfig]] = []

    def make(cfg: SwarmConfig) -> SlurmServing:
        s = SlurmServing(cfg, SwarmPaths.of(cfg.name, str(scratch)))
        made.append((s, cfg))
        return s

    yield make
    for s, cfg in made:
        s.delete(ServingHandle(cfg.name, "slurm", meta={"replicas": cfg.replicas}))


def open_to_others(root: Path) -> list[str]:
    """What ``find ROOT -perm /077`` lists: anything another user may read, write or enter."""
    out = subprocess.run(["find", str(root), "-perm", "/077"], capture_output=True, text=True, check=True)
    return out.stdout.split()


@needs_root
@pytest.mark.parametrize(
    ("swarms_by", "refused"),
    [
        ("her", r"swarms: it is a shared folder of nobody, who may replace what is in it"),  # she made both
        ("site", r"swarms/t-[0-9a-f]+: it belongs to nobody, not to you"),  # a sticky swarms/ of root's
    ],
)
def test_a_swarm_folder_another_user_made_first_is_refused_before_anything_is_submitted(
    scratch: Path, swarm_home: Path, swarms_by: str, refused: str
) -> None:
    cfg = stub_config(replicas=1, backend={"run_dir": str(scratch)})
    folder = scratch / "swarms" / cfg.name
    if swarms_by == "site":
        (scratch / "swarms").mkdir(mode=0o1777)
        os.chmod(scratch / "swarms", 0o1777)

    def squat() -> str:
        folder.mkdir(parents=True, mode=0o777)
        if swarms_by == "her":
            os.chmod(scratch / "swarms", 0o1777)
        os.chmod(folder, 0o777)
        (folder / "replicas.sbatch").write_text("#!/bin/bash\nid > /tmp/owned-by-her\n")
        return str(folder)

    ok, value = as_user(NOBODY, squat)
    assert ok, value
    with pytest.raises(AccessError, match=refused) as err:
        Swarm(cfg).up()
    assert str(scratch) in str(err.value) and "mkdir -m 700" in str(err.value)
    assert our_jobs(cfg) == ""
    assert (folder / "replicas.sbatch").read_text() == "#!/bin/bash\nid > /tmp/owned-by-her\n"
    assert sorted(p.name for p in folder.iterdir()) == ["replicas.sbatch"]  # nothing of the owner's in it


@needs_root
def test_nothing_of_the_owners_is_open_and_a_changed_script_is_never_run(
    serving: Callable[[SwarmConfig], SlurmServing], scratch: Path, tmp_path: Path
) -> None:
    cfg = stub_config(replicas=1, backend={"run_dir": str(scratch)})
    swarm = serving(cfg)
    handle = swarm.create_or_update(cfg)
    swarm.wait_ready(handle, 120)
    spec = make_job(tmp_path, 40, shards=2, job_dir=str(swarm.paths.job_dir("j1")))
    compute = SlurmCompute(cfg, swarm.paths, handle)
    job = compute.submit(JobRequest(name="chat", command=job_command(spec), nshards=2))
    assert compute.wait(job, poll_s=0.5) is JobStatus.SUCCEEDED, compute.probe(job)
    assert len(output_ids(tmp_path)) == 40
    root = swarm.paths.root
    assert list((root / "jobs" / "j1" / "shards").iterdir()), "the job kept its ledger in the swarm folder"
    assert open_to_others(root.parent) == []  # swarms/, the swarm, its jobs, shards, logs, LB files, Slurm's .out

    ok, value = as_user(NOBODY, lambda: sorted(os.listdir(root)))
    assert not ok and value.startswith("PermissionError"), value
    ok, value = as_user(NOBODY, lambda: (root / "replicas.sbatch").write_text("#!/bin/bash\nid\n"))
    assert not ok and value.startswith("PermissionError"), value
    ok, value = as_user(NOBODY, lambda: swarm.paths.api_key_file.read_text())
    assert not ok and value.startswith("PermissionError"), value

    # As if she had got in anyway: the script on disk is not the one `up` rendered. The LB's
    # reconciler, which resubmits a lost replica task, refuses it and stops the swarm instead.
    marker = scratch / "ran-her-script"
    script = swarm.paths.replicas_script
    script.write_text(script.read_text().replace("set -uo pipefail\n", f"set -uo pipefail\ntouch {marker}\n", 1))
    record = read_json(swarm.paths.slurm_record)
    SlurmClient().scancel([record["tasks"]["0"]])
    wait_until(
        "the record to say stopped",
        lambda: read_json(swarm.paths.slurm_record) or {},
        until=lambda r: "stopped" in r,
        timeout_s=60,
    )
    reason = read_json(swarm.paths.slurm_record)["stopped"]["reason"]
    assert "is not the script `up` wrote" in reason and str(script) in reason, reason
    wait_until(
        "no job of the swarm queued", lambda: our_jobs(cfg), until=lambda q: q == "", timeout_s=60
    )  # stopped, nothing resubmitted
    assert not marker.exists()
