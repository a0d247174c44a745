"""Docs are tests: every shell command the docs show either runs here or is listed below with why not.

Commands are extracted from the ```bash (sh, console, shell) blocks of README.md,
deployments/README.md, CONTRIBUTING.md and every page of the docs site (docs/), and from the command
comments of examples/*.yaml (``#   prefect-swarm ...``), so a command added to the docs is covered
(or must be listed) without touching this file's logic.
The runnable ones run in document order, as a reader would type them, against a stub swarm with
its own PREFECT_SWARM_HOME and free ports (``PREFECT_SWARM_PORT``, config precedence level 4).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from prefect_swarm.testing import free_port_block

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    "README.md",
    "deployments/README.md",
    "CONTRIBUTING.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")),
]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

EXTERNAL_CLI_TEST = "tests/external/test_external.py::test_cli_up_status_job_down_on_a_stub_it_never_stops"

NOT_RUN_HERE: dict[str, str] = {
    # Installing and running the whole suite: what CI (.ci/run) does; not from inside a test.
    "make demo": "runs examples/demo.py: tests/prefect/test_demo_vllm.py runs it against the vLLM CPU build",
    "python examples/own_flow.py": "tests/prefect/test_own_flow.py runs its flow through a real worker",
    "python examples/judge_pipeline.py": "needs a Prefect server: tests/prefect/test_pipeline.py runs its stages "
    "through a real worker (the pipeline/on-demand deployment)",
    "python examples/swarm_spec_block.py": "needs a Prefect server: tests/prefect/test_blocks.py::"
    "test_the_documented_block_script_saves_a_loadable_block",
    "mkdocs build": "tests/docs/test_site.py builds the site in strict mode",
    "make test": "the whole suite (CI's entry point, .ci/run)",
    "python scripts/ci_runs.py": "the whole suite on fresh clones: tests/architecture/test_ci_runs.py runs the "
    "script with a stand-in for .ci/run",
    "make unit": "the fast subset of the whole suite",
    "make venv": "installs the venv these tests run in",
    "make test-latest": "the fast subset and the smoke tests in a venv of the newest releases (a whole test run)",
    "make lock": "rewrites requirements/ from the index on purpose; tests/architecture/test_lock.py checks the result",
    "make lint typecheck": "ruff and mypy over the tree (make test runs them)",
    "pytest": "a test run from inside a test run",
    "pip install": "installs packages (scripts/install_python_deps.sh does this for make venv)",
    "export ": "shell state only",
    # The Prefect path of deployments/README.md: tests/prefect/stack.py runs these very commands
    # (server start --analytics-off on a free port, work-pool create swarm-pool --type process,
    # deploy --prefect-file deployments/prefect.yaml --all, worker start --pool swarm-pool --type
    # process, automations install), tests/prefect/test_blocks.py `block register -m prefect_swarm`,
    # tests/prefect/test_deployment_e2e.py `deployment run batch-inference/on-demand --param ... --watch`.
    "prefect server start": "tests/prefect/stack.py (start_server)",
    "prefect work-pool create": "tests/prefect/stack.py (deploy)",
    "prefect block register": "tests/prefect/test_blocks.py::test_register_save_load_use_in_flow",
    "prefect --no-prompt deploy": "tests/prefect/stack.py (deploy)",
    "prefect worker start": "tests/prefect/stack.py (start_worker)",
    "prefect deployment run": "tests/prefect/test_deployment_e2e.py (needs blocks a reader saved: swarm-spec/qwen-7b)",
    "prefect-swarm automations install": "needs a Prefect server: tests/prefect/stack.py (deploy) runs it",
    # The Getting-started pages' server path: tests/docs/test_getting_started.py runs those pages as one
    # script (server, pool, blocks, deploy, automations, worker, a deployment on a schedule) until a
    # scheduled run completes.
    "timeout 120 sh -c 'until curl": "waits for the server: tests/docs/test_getting_started.py",
    "mkdir -p $PREFECT_HOME": "tests/docs/test_getting_started.py",
    "prefect deployment ls": "tests/docs/test_getting_started.py",
    "prefect flow-run ls": "tests/docs/test_getting_started.py",
    # A Slurm cluster with GPUs and a Lepton workspace: the tutorials' cluster commands. The same CLI path
    # runs on the single-node Slurm (up, job submit, down with a stub engine) and the fake Lepton API.
    "prefect-swarm up -c examples/slurm.yaml": "needs a GPU cluster: tests/slurm/test_slurm_cluster.py",
    "prefect-swarm status qwen-7b": "needs a GPU cluster: tests/slurm/test_slurm_cluster.py",
    "prefect-swarm job submit -n qwen-7b": "needs a GPU cluster: tests/slurm/test_slurm_cluster.py",
    "prefect-swarm down qwen-7b": "needs a GPU cluster: tests/slurm/test_slurm_cluster.py",
    "prefect-swarm up -c examples/lepton.yaml": "needs a Lepton workspace: tests/lepton/test_lepton_job_e2e.py",
    "prefect-swarm status llama-8b": "needs a Lepton workspace: tests/lepton/test_lepton_job_e2e.py",
    "prefect-swarm job submit -n llama-8b": "needs a Lepton workspace: tests/lepton/test_lepton_job_e2e.py",
    "prefect-swarm down llama-8b": "needs a Lepton workspace: tests/lepton/test_lepton_job_e2e.py",
    # The external backend needs a server someone else runs: the test starts one and runs these commands
    # with examples/external.yaml aimed at it (tests/external/test_external.py, test_external_vllm.py).
    "prefect-swarm up -c examples/external.yaml": EXTERNAL_CLI_TEST,
    "prefect-swarm job submit -n external": EXTERNAL_CLI_TEST,
    "prefect-swarm down external": EXTERNAL_CLI_TEST,
    # The batch service runs until stopped; its tests start it this very way and run the client against it.
    "prefect-swarm serve batches": "runs until stopped: tests/batchserver/conftest.py (Service.start) starts it so",
    "OPENAI_BASE_URL=": "needs a running batch service: tests/batchserver/test_service.py::"
    "test_the_documented_client_runs runs the script against one",
    # Sleep and wake need an engine with sleep mode (vLLM on a GPU): the same commands run on a swarm of the
    # GPU-like simulator in tests/cli/test_cli_sleep.py; the GPU check needs a GPU and vLLM.
    "prefect-swarm up -c sleepy.yaml": "needs GPUs: tests/cli/test_cli_sleep.py runs it on the simulator",
    "prefect-swarm sleep ": "needs engine.sleep_mode: tests/cli/test_cli_sleep.py runs it on the simulator",
    "prefect-swarm wake ": "needs engine.sleep_mode: tests/cli/test_cli_sleep.py runs it on the simulator",
    "scripts/gpu/sleep_wake_check.sh": "needs a CUDA GPU and vLLM",
}
"""Command prefixes that do not run here, each with the reason or the test that covers it."""

EXPECTED_EXIT = {
    "prefect-swarm down local-stub": 1,  # asks first; without a terminal and without -y it declines
    "prefect-swarm db prune": 1,  # likewise: asks before removing records
}
"""Commands whose documented behaviour here is a non-zero exit."""


def shell_blocks(text: str) -> Iterator[str]:
    """The bodies of ```bash / ```sh / ```console blocks."""
    yield from re.findall(r"```(?:bash|sh|console|shell)\n(.*?)```", text, flags=re.S)


def commands_in(block: str) -> list[str]:
    """One command per logical line: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        cmd = re.split(r"\s+#\s", " " + line.strip(), maxsplit=1)[0].strip().rstrip("&").strip()
        if cmd and not cmd.startswith("#"):
            out.append(cmd)
    return out


def doc_commands(doc: str) -> list[str]:
    """Every command shown in a Markdown file."""
    return [cmd for block in shell_blocks((REPO / doc).read_text()) for cmd in commands_in(block)]


def example_commands(path: Path) -> list[str]:
    """Commands in an example config's comments (``#   prefect-swarm ...``)."""
    lines = re.findall(r"^#\s+((?:prefect-swarm|pip|python|make)\b.*)$", path.read_text(), flags=re.M)
    return [c for line in lines for c in commands_in(line)]


def skip_reason(cmd: str) -> str | None:
    """Why ``cmd`` does not run here, or None."""
    bare = cmd.removeprefix(".venv/bin/")
    return next((why for prefix, why in NOT_RUN_HERE.items() if bare.startswith(prefix)), None)


def test_every_doc_command_is_runnable_or_listed() -> None:
    cmds = [c for doc in DOCS for c in doc_commands(doc)] + [c for p in EXAMPLES for c in example_commands(p)]
    assert len(cmds) > 20, cmds
    unknown = [c for c in cmds if skip_reason(c) is None and runner_for(c) is None]
    assert not unknown, f"commands in the docs that this test neither runs nor lists in NOT_RUN_HERE: {unknown}"


def runner_for(cmd: str) -> list[str] | None:
    """argv prefix that runs ``cmd`` here (without its pipe), or None when it is not a command we run."""
    bare = cmd.removeprefix(".venv/bin/")
    if bare.startswith("prefect-swarm "):
        return [sys.executable, "-m", "prefect_swarm.cli.main"]
    if bare.startswith("python "):
        return [sys.executable]
    return None


@pytest.fixture
def doc_env(swarm_home: Path, tmp_path: Path) -> Callable[[str], subprocess.CompletedProcess[str]]:
    """Run one doc command from the repository root with a free port block and no cloud secrets."""
    env = {k: v for k, v in os.environ.items() if k != "LEPTON_WORKSPACE_TOKEN"}
    env.update(PREFECT_SWARM_PORT=str(free_port_block(4)), COLUMNS="200", PREFECT_API_URL="")

    def run(cmd: str) -> subprocess.CompletedProcess[str]:
        cmd = cmd.replace("/tmp/", f"{tmp_path}/")
        main, _, pipe = cmd.partition(" | ")
        argv = shlex.split(main.removeprefix(".venv/bin/"))
        prefix = runner_for(main)
        assert prefix is not None, cmd
        out = subprocess.run(
            [*prefix, *argv[1:]],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
        if pipe and out.returncode == 0:
            out = subprocess.run(shlex.split(pipe), input=out.stdout, capture_output=True, text=True, timeout=30)
        return out

    return run


def _expected(cmd: str) -> int:
    return EXPECTED_EXIT.get(cmd.removeprefix(".venv/bin/").strip(), 0)


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS)
def test_doc_commands_run(doc: str, doc_env: Callable[[str], subprocess.CompletedProcess[str]]) -> None:
    ran = []
    try:
        for cmd in doc_commands(doc):
            if skip_reason(cmd) is not None or runner_for(cmd) is None:
                continue
            if " | jq " in cmd and not _have("jq"):
                cmd = cmd.partition(" | ")[0]
            out = doc_env(cmd)
            ran.append(cmd)
            assert out.returncode == _expected(cmd), (
                f"{doc}: `{cmd}` exited {out.returncode}\n{out.stdout}\n{out.stderr}"
            )
            assert "Traceback" not in out.stderr, f"{doc}: `{cmd}` printed a traceback:\n{out.stderr}"
    finally:
        doc_env("prefect-swarm down --all -y")
    if doc == "README.md":
        assert len(ran) >= 3, ran  # the front door's one example
    if doc == "docs/cli.md":
        assert len(ran) >= 15, ran


def _have(tool: str) -> bool:
    from shutil import which

    return which(tool) is not None


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_every_example_validates(
    example: Path, fmt: str, doc_env: Callable[[str], subprocess.CompletedProcess[str]]
) -> None:
    """`prefect-swarm validate -c examples/X.yaml` (and `-o json`) exits 0 and prints a plan; Lepton
    without a token in the environment."""
    out = doc_env(f"prefect-swarm validate --offline -c examples/{example.name} -o {fmt}")  # site configs
    assert out.returncode == 0, f"validate {example.name} -o {fmt} exited {out.returncode}\n{out.stdout}\n{out.stderr}"
    assert "Traceback" not in out.stderr
    if fmt == "json":
        doc = json.loads(out.stdout)
        assert doc["schema_version"] == 1 and doc
    else:
        assert out.stdout.strip()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_comment_commands_run(
    example: Path, doc_env: Callable[[str], subprocess.CompletedProcess[str]]
) -> None:
    """The commands an example's comments show (those that run here) succeed."""
    for cmd in example_commands(example):
        if skip_reason(cmd) is not None or cmd.startswith("prefect-swarm up"):
            continue  # `up` of the stub example runs in test_doc_commands_run (README)
        out = doc_env(cmd)
        assert out.returncode == 0, f"{example.name}: `{cmd}` exited {out.returncode}\n{out.stdout}\n{out.stderr}"
