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
