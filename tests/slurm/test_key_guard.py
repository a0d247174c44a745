"""psw_key_guard (prefect_swarm.sidecar.key_guard): the ASGI middleware that closes every route of a vLLM
replica, and the LB's key check (auth.conf); the real engines and nginx are in test_lb.py,
test_slurm_reconcile.py and test_slurm_backend.py."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from prefect_swarm.backends.slurm.lb import render_auth
from prefect_swarm.sidecar.key_guard import KeyGuard

KEY = "sk.a+b/c~d_e-f=="


def app_with_routes() -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"ok": "yes"}

    @app.post("/invocations")
    def invocations() -> dict[str, str]:
        return {"ran": "yes"}

    sub = FastAPI()

    @sub.get("/")
    def metrics() -> str:
        return "metrics"

    app.mount("/metrics", sub)
    return app


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> TestClient:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    app = app_with_routes()
    app.add_middleware(KeyGuard)  # what vLLM does with --middleware psw_key_guard.KeyGuard
    return TestClient(app)


def test_every_route_of_the_app_needs_the_key(guarded: TestClient) -> None:
    app: Any = guarded.app
    paths = sorted({getattr(r, "path", "") for r in app.routes} - {""})
    assert {"/health", "/invocations", "/metrics", "/openapi.json", "/docs"} <= set(paths)
    for path in [*paths, "/no-such-route"]:
        for method in ("GET", "POST"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"bearer {KEY.upper()}"}):
                resp = guarded.request(method, path, headers=headers)
                assert resp.status_code == 401, (method, path, headers, resp.status_code)
                assert resp.json() == {"error": "Unauthorized"}
    auth = {"Authorization": f"Bearer {KEY}"}
    assert guarded.get("/health", headers=auth).json() == {"ok": "yes"}
    assert guarded.post("/invocations", headers=auth).json() == {"ran": "yes"}
    assert guarded.get("/metrics/", headers=auth).status_code == 200


def test_a_websocket_without_the_key_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("reached the app")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(KeyGuard(app)({"type": "websocket", "path": "/v1/realtime", "headers": []}, None, send))  # type: ignore[arg-type]
    assert sent == [{"type": "websocket.close", "code": 1008}]


def test_no_key_in_the_environment_means_no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv("PREFECT_SWARM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="refusing to serve without a key"):
        KeyGuard(app_with_routes())


def test_the_lb_check_matches_the_exact_header_only() -> None:
    text = render_auth(KEY)
    found = re.search(r'"~(.*)" 0;', text)
    assert found and "default 1;" in text
    pattern = re.compile(found.group(1))  # nginx's PCRE reads it as Python's re does here
    assert pattern.match(f"Bearer {KEY}")
    for header in (
        f"Bearer {KEY}x",
        f"bearer {KEY}",
        f"Bearer {KEY.upper()}",
        "Bearer sk.a+b/c~d_e-f=",
        "Bearer skXa+b/c~d_e-f==",
    ):
        assert not pattern.match(header), header
    assert "default 0;" in render_auth(None)
    with pytest.raises(ValueError, match="not a bearer token") as err:
        render_auth('k"ey; }')
    assert "ey; }" not in str(err.value)


def test_an_api_key_that_is_no_bearer_token_is_refused_before_anything_runs() -> None:
    from _slurmkit import stub_config
    from pydantic import SecretStr

    from prefect_swarm.backends.slurm import render
    from prefect_swarm.exceptions import ConfigError

    cfg = stub_config(replicas=1)
    render.check_api_key(cfg.model_copy(update={"api_key": SecretStr(KEY)}))
    for bad in ('k"ey', "k ey", "a$b", "k\\ey", "=key"):
        with pytest.raises(ConfigError, match="bearer token") as err:
            render.check_api_key(cfg.model_copy(update={"api_key": SecretStr(bad)}))
        assert bad not in str(err.value)


def test_a_closed_vllm_swarm_renders_the_guard_and_no_secret(tmp_path: Any) -> None:
    from _slurmkit import stub_config

    from prefect_swarm.backends.slurm import render

    secret = "sk-" + "s" * 30
    vllm = {"kind": "vllm", "command": None, "python": "/opt/vllm/bin/python"}
    closed = stub_config(replicas=1, api_key=secret, engine=vllm, backend={"run_dir": str(tmp_path)})
    plan = render.render_plan(closed)
    assert "psw_key_guard.py" in plan and "--middleware" in plan["watchdog-0.json"]
    assert "engine-path" in plan["replicas.sbatch"] and all(secret not in text for text in plan.values())
    opened = stub_config(replicas=1, engine=vllm, backend={"run_dir": str(tmp_path), "open_endpoint": True})
    assert "psw_key_guard.py" not in render.render_plan(opened)
