"""The LB reconciler and the rendered nginx config, with a real nginx and stub engines (no Slurm needed)."""

from __future__ import annotations

import re
import secrets
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from _slurmkit import stub_config

from prefect_swarm.backends.slurm import render
from prefect_swarm.backends.slurm.lb import STRIKES, Reconciler, write_auth
from prefect_swarm.interfaces.jobenv import API_KEY
from prefect_swarm.paths import SwarmPaths
from prefect_swarm.testing import free_port, free_port_block
from prefect_swarm.testing.stub_engine import COMPLETION_PATHS, ROUTES, StubEngine
from prefect_swarm.testing.waiting import wait_until

pytestmark = pytest.mark.nginx


@contextmanager
def running_lb(tmp_path: Path, key: str | None) -> Iterator[tuple[SwarmPaths, Reconciler, str]]:
    """nginx in the foreground with the rendered config (proxy timeout 1 s), auth.conf for ``key`` (None:
    an open endpoint) as the LB job writes it, and a reconciler (no loop)."""
    cfg = stub_config(replicas=2, backend={"shared_dir": str(tmp_path), "proxy_timeout_s": 1})
    paths = render.swarm_paths(cfg).ensure()
    port = free_port()
    (paths.lb_dir / "tmp").mkdir(parents=True)
    (paths.lb_dir / "listen.conf").write_text(f"listen 127.0.0.1:{port};\n")
    write_auth(paths.lb_auth_conf, key)
    paths.nginx_conf.write_text(render.render_nginx(cfg, paths))
    nginx = ["nginx", "-c", str(paths.nginx_conf), "-e", str(paths.lb_error_log)]
    rec = Reconciler(paths, nginx, public=f"127.0.0.1:{port}")
    rec.step(reload=False)
    proc = subprocess.Popen([*nginx, "-g", "daemon off;"])
    try:

        def announced() -> bool:
            rec.announce()
            return bool(rec.announced)

        wait_until("the LB to announce itself", announced, timeout_s=10, poll_s=0.1)
        assert paths.lb_head.read_text().strip() == f"127.0.0.1:{port}"
        yield paths, rec, f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def lb(need_nginx: None, tmp_path: Path) -> Iterator[tuple[SwarmPaths, Reconciler, str]]:
    """An open LB (no key)."""
    with running_lb(tmp_path, None) as found:
        yield found


def _wait_reloaded(url: str) -> None:
    """Until the new workers serve (a reload swaps workers asynchronously)."""
    wait_until(
        "the LB's new workers to answer /health",
        lambda: httpx.get(url + "/health", timeout=5).status_code,
        until=lambda code: code == 200,
        timeout_s=10,
        poll_s=0.1,
    )


def _post(url: str) -> int:
    body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=10).status_code


def test_a_timed_out_post_is_not_replayed(lb: tuple[SwarmPaths, Reconciler, str]) -> None:
    paths, rec, url = lb
    base = free_port_block(2)
    with StubEngine(base) as good, StubEngine(base + 1, timeout_rate=1.0) as mute:
        paths.replica_head(0).write_text(f"127.0.0.1:{base}\n")
        paths.replica_head(1).write_text(f"127.0.0.1:{base + 1}\n")
        assert rec.step()
        _wait_reloaded(url)
        codes = [_post(url) for _ in range(10)]
        assert sorted(set(codes)) == [200, 504], codes
        # every request reached exactly one replica: the 504s were not retried on the good one
        assert good.stats()["requests"] == codes.count(200)
        assert mute.stats()["requests"] == codes.count(504)


def test_dead_or_removed_replicas_leave_the_upstream(lb: tuple[SwarmPaths, Reconciler, str]) -> None:
    paths, rec, url = lb
    base = free_port_block(2)
    with StubEngine(base) as first:
        second = StubEngine(base + 1).start()
        paths.replica_head(0).write_text(f"localhost:{base}\n")  # resolved to IPv4 by the reconciler
        paths.replica_head(1).write_text(f"127.0.0.1:{base + 1}\n")
        rec.step()
        _wait_reloaded(url)
        assert rec.upstreams.read_text().count("server 127.0.0.1:") == 2
        second.stop()  # dies without removing its head file (SIGKILLed task, dead node)
        for _ in range(STRIKES):
            rec.step()
        assert f":{base + 1} " not in rec.upstreams.read_text()
        time.sleep(0.5)
        assert all(_post(url) == 200 for _ in range(6))
        assert first.stats()["requests"] == 6
        paths.replica_head(0).unlink()  # a replica that stops cleanly removes its head file
        rec.step()
        assert "down" in rec.upstreams.read_text()  # placeholder: an empty upstream is a config error
        time.sleep(0.5)
        assert _post(url) == 502


def test_a_config_nginx_rejects_keeps_the_running_one(lb: tuple[SwarmPaths, Reconciler, str]) -> None:
    paths, rec, url = lb
    base = free_port_block(1)
    with StubEngine(base):
        paths.replica_head(0).write_text(f"127.0.0.1:{base}\n")
        rec.step()
        _wait_reloaded(url)
        good = rec.upstreams.read_text()
        rec.nginx = [*rec.nginx[:1], "-c", "/nonexistent.conf"]  # make `nginx -t` fail
        paths.replica_head(1).write_text(f"127.0.0.1:{base}\n")
        rec.strikes.clear()
        paths.replica_head(0).unlink()
        paths.replica_head(1).unlink()
        rec.step()
        assert rec.upstreams.read_text() == good
        assert _post(url) == 200


def test_a_closed_lb_refuses_every_route_without_the_key(
    need_nginx: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk.k+" + secrets.token_urlsafe(24)
    monkeypatch.setenv(API_KEY, key)  # the LB job's environment: the reconciler's own check sends it
    base = free_port_block(1)
    with running_lb(tmp_path, key) as (paths, rec, url), StubEngine(base, api_key=key) as stub:
        assert stat.S_IMODE(paths.lb_auth_conf.stat().st_mode) == 0o600
        assert key not in paths.nginx_conf.read_text()
        auth = {"Authorization": f"Bearer {key}"}
        paths.replica_head(0).write_text(f"127.0.0.1:{base}\n")
        assert rec.step()
        wait_until(
            "the LB to answer /health with the key",
            lambda: httpx.get(url + "/health", headers=auth, timeout=5).status_code,
            until=lambda code: code == 200,
            timeout_s=10,
            poll_s=0.1,
        )
        # every location of the rendered nginx.conf, every route of the stub, and one nobody serves
        locations = re.findall(r"^\s*location\s+(?:=\s*)?(\S+)\s*\{", paths.nginx_conf.read_text(), re.M)
        assert {"/nginx-health", "/nginx-status", "/"} <= set(locations)
        routes = sorted({*locations, *ROUTES, "/no-such-route"})
        wrong = ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"bearer {key}"}, {"X-Api-Key": key})
        for route in routes:
            for method in ("GET", "POST"):
                for headers in wrong:
                    resp = httpx.request(method, url + route, headers=headers, json={}, timeout=10)
                    assert resp.status_code == 401, (method, route, headers, resp.status_code, resp.text)
                with_key = httpx.request(method, url + route, headers=auth, json={}, timeout=10)
                assert with_key.status_code != 401, (method, route)
        assert stub.stats()["requests"] <= 2 * len(COMPLETION_PATHS)  # only keyed requests reached it
        for route in ROUTES:  # and the stub itself (a replica's port) refuses them too
            assert httpx.get(stub.url + route, timeout=5).status_code == 401, route
            assert httpx.post(stub.url + route, json={}, timeout=5).status_code == 401, route
        body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}]}
        resp = httpx.post(url + "/v1/chat/completions", json=body, headers=auth, timeout=10)
        assert resp.status_code == 200 and resp.json()["choices"], resp.text
