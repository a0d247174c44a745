"""Blocks: built from the config models (no drift), Prefect's standard suite, save/load/use, secrets."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import typing
from pathlib import Path

import pytest
from helpers import job_options, prompts, stub_swarm
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from pydantic import SecretStr
from stack import PrefectStack

from prefect_swarm.blocks import BACKEND_BLOCKS, ExternalBackend, LeptonBackend, LocalBackend, SlurmBackend, SwarmSpec
from prefect_swarm.config import ExternalConfig, LeptonConfig, LocalConfig, SlurmConfig, SwarmConfig, load_config

PAIRS = [
    (LocalBackend, LocalConfig),
    (SlurmBackend, SlurmConfig),
    (LeptonBackend, LeptonConfig),
    (ExternalBackend, ExternalConfig),
    (SwarmSpec, SwarmConfig),
]
SECRET = "lepton-token-DO-NOT-LEAK-7f3a9c"


@pytest.mark.parametrize(("block", "config"), PAIRS, ids=lambda c: c.__name__)
def test_block_fields_cannot_drift(block: type[Block], config: type) -> None:
    assert set(block.model_fields) == set(config.model_fields)
    for name, want in config.model_fields.items():
        got = block.model_fields[name]
        assert got.description == want.description, name
        assert got.alias == want.alias, name
        if block is SwarmSpec and name == "backend":  # the one override: backend configs -> backend blocks
            members = typing.get_args(got.annotation)
            assert {m.config_model for m in members} == {LocalConfig, SlurmConfig, LeptonConfig, ExternalConfig}
            assert all(issubclass(m, m.config_model) for m in members)
            assert got.default_factory.config_model is want.default_factory  # type: ignore[union-attr]
            continue
        assert got.annotation == want.annotation, name
        assert got.default == want.default and got.default_factory == want.default_factory, name
        assert got.metadata == want.metadata, name
    assert issubclass(block, config)  # validators come along too


def test_block_validates_like_config() -> None:
    with pytest.raises(ValueError, match="Slurm time"):
        SlurmBackend(time_limit="soon")
    with pytest.raises(ValueError, match="Extra inputs"):
        LocalBackend(hosts="x")


def test_round_trip_config_block_config() -> None:
    cfg = load_config(data=stub_swarm("rt"), use_defaults_file=False)
    assert SwarmSpec.from_config(cfg).to_config() == cfg
    lep = SwarmConfig(name="l", model="m", backend=LeptonConfig(workspace_id="w", token=SecretStr(SECRET)))
    back = SwarmSpec.from_config(lep).to_config()
    assert back.backend.token.get_secret_value() == SECRET  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "block", [LocalBackend, SlurmBackend, LeptonBackend, ExternalBackend, SwarmSpec], ids=lambda b: b.__name__
)
class TestBlockStandards(BlockStandardTestSuite):
    @pytest.fixture
    def block(self, block: type[Block]) -> type[Block]:
        return block

    def test_has_a_valid_image(self, block: type[Block]) -> None:
        """No external logo URL (Prefect's block-type API takes only http(s) URLs; the project publishes
        none); the logo that ships in the package meets Prefect's rules for one."""
        from PIL import Image

        from prefect_swarm.blocks.core import LOGO

        assert block._logo_url is None
        img = Image.open(LOGO)
        assert img.width == img.height and 1000 > img.width > 45


def test_logo_ships_as_package_data() -> None:
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert "blocks/logo.png" in pyproject["tool"]["setuptools"]["package-data"]["prefect_swarm"]


def test_the_catalog_offers_only_the_public_blocks() -> None:
    """A Prefect server registers every class in the client's block registry (its catalog): ours are
    the public blocks, never their private base class."""
    import subprocess
    import sys

    code = (
        "from prefect.blocks.core import Block; from prefect.utilities.dispatch import get_registry_for_type; "
        "import prefect_swarm.blocks as b; "
        "ours = [c for c in get_registry_for_type(Block).values() if c.__module__.startswith(b.__name__)]; "
        "print(sorted(c.__name__ for c in ours))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    public = sorted(cls.__name__ for cls in (*BACKEND_BLOCKS.values(), SwarmSpec))
    assert out.stdout.strip() == repr(public), (out.stdout, public)


def test_register_top_package_lazily() -> None:
    import subprocess
    import sys

    code = "import sys, prefect_swarm; assert 'prefect' not in sys.modules; print(sorted(dir(prefect_swarm)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "SwarmSpec" in out.stdout


@pytest.mark.prefect_server
def test_register_save_load_use_in_flow(prefect_api: PrefectStack, tmp_path: Path) -> None:
    from prefect_swarm.flows import batch_inference

    out = prefect_api.cli("block", "register", "-m", "prefect_swarm")
    assert "Swarm Spec" in out.stdout and "Swarm Lepton Backend" in out.stdout
    cfg = load_config(data=stub_swarm("fromblock"), use_defaults_file=False)
    backend = LocalBackend.from_config(cfg.backend)  # type: ignore[arg-type]
    backend.save("local-fast", overwrite=True)
    spec = SwarmSpec.from_config(cfg)
    spec.backend = LocalBackend.load("local-fast")
    spec.save("fromblock", overwrite=True)
    loaded = SwarmSpec.load("fromblock")
    assert loaded.to_config() == cfg
    inp = prompts(tmp_path / "in.parquet", 12)
    res = batch_inference("swarm-spec/fromblock", job_options(), str(inp), str(tmp_path / "o.parquet"))
    assert res["ok"] == 12


@pytest.mark.prefect_server
def test_lepton_token_never_leaks(prefect_api: PrefectStack, swarm_home: Path, tmp_path: Path) -> None:
    from prefect.deployments import run_deployment
    from stack import job_variables

    LeptonBackend(workspace_id="ws-test", workspace_url="http://127.0.0.1:9/api", token=SecretStr(SECRET)).save(
        "lep-secret", overwrite=True
    )
    spec = SwarmSpec(name="lep", model="m", backend=LeptonBackend.load("lep-secret"))
    spec.save("lep", overwrite=True)
    inp = prompts(tmp_path / "in.parquet", 4)
    run = run_deployment(
        "batch-inference/on-demand",
        timeout=240,
        job_variables=job_variables(swarm_home),
        parameters={
            "swarm": "swarm-spec/lep",
            "job": job_options(),
            "input": str(inp),
            "output": str(tmp_path / "o.parquet"),
            "shards": 1,
        },
    )
    assert run.state is not None and run.state.type.value == "FAILED"  # no Lepton API there: swarm-up fails
    texts = asyncio.run(_everything_prefect_knows(run.id))
    texts.append((prefect_stack_home(prefect_api) / "worker.log").read_text(errors="replace"))
    texts += _state_db_dump(swarm_home)
    texts += [p.read_text(errors="replace") for p in swarm_home.rglob("*") if p.is_file() and p.suffix != ".db"]
    assert texts and not [t for t in texts if SECRET in t], "the Lepton token leaked"
    blocks = prefect_api.cli("block", "inspect", "swarm-lepton-backend/lep-secret").stdout
    assert SECRET not in blocks


def prefect_stack_home(stack: PrefectStack) -> Path:
    return stack.home


async def _everything_prefect_knows(run_id: typing.Any) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, LogFilter, LogFilterFlowRunId

    async with get_client() as client:
        run = await client.read_flow_run(run_id)
        logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        arts = await client.read_artifacts(flow_run_filter=FlowRunFilter(id={"any_": [run_id]}))
        tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [run_id]}))
        states = await client.read_flow_run_states(run_id)
    return [
        json.dumps(run.parameters),
        str(run.state),
        *(lg.message for lg in logs),
        *(json.dumps(a.data, default=str) for a in arts),
        *(str(t.state) for t in tasks),
        *(str(s.message) for s in states),
    ]


def _state_db_dump(home: Path) -> list[str]:
    db = sqlite3.connect(home / "state.db")
    try:
        return [json.dumps(row) for table in ("swarms", "jobs") for row in db.execute(f"SELECT * FROM {table}")]
    finally:
        db.close()


@pytest.mark.prefect_server
def test_the_documented_block_script_saves_a_loadable_block(prefect_api: PrefectStack) -> None:
    """docs/blocks.md's command: `python examples/swarm_spec_block.py --config FILE --name NAME`."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    prefect_api.cli("block", "register", "-m", "prefect_swarm")
    script = ["examples/swarm_spec_block.py", "--config", "examples/local-stub.yaml", "--name", "doc-stub"]
    argv = [sys.executable, *script]
    out = subprocess.run(argv, cwd=repo, env=prefect_api.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "saved swarm-spec/doc-stub" in out.stdout
    again = subprocess.run(argv, cwd=repo, env=prefect_api.env, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "--overwrite" not in again.stdout  # an existing block is not replaced silently
    expected = load_config(repo / "examples" / "local-stub.yaml", use_defaults_file=False, environ={})
    loaded = SwarmSpec.load("doc-stub").to_config()
    assert (loaded.name, loaded.model, loaded.replicas, loaded.backend.type) == (
        expected.name,
        expected.model,
        expected.replicas,
        expected.backend.type,
    )
