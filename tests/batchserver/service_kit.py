"""The batch service as a client meets it: `prefect-swarm serve batches` in a process of its own on
loopback, keys made with `prefect-swarm serve keys create`; and the client's side (polling, files, lines).
Imported by tests/batchserver (its conftest) and tests/prefect (a batch as a deployment run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from prefect_swarm.testing import free_port
from prefect_swarm.testing.waiting import wait_until

READY = "batch service on "


def cli_argv() -> list[str]:
    """The installed ``prefect-swarm`` script of this interpreter."""
    return [str(Path(sys.executable).with_name("prefect-swarm"))]


class Service:
    """One `prefect-swarm serve batches` process (started again after a kill with :meth:`start`)."""

    def __init__(self, home: Path, config: Path, env: dict[str, str] | None = None) -> None:
        self.home, self.config, self.port = home, config, free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.env = {**os.environ, "PREFECT_SWARM_HOME": str(home), "COLUMNS": "200", **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.log = ""

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run `prefect-swarm ARGS` with the service's home."""
        return subprocess.run([*cli_argv(), *args], capture_output=True, text=True, env=self.env, timeout=timeout)

    def key(self, tenant: str) -> str:
        """A new key of ``tenant``, made as a user makes one."""
        res = self.cli("serve", "keys", "create", tenant)
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    def start(self, timeout_s: float = 60) -> Service:
        """Start the service; return once it says it is serving."""
        argv = [*cli_argv(), "serve", "batches", "-c", str(self.config), "--port", str(self.port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env)
        ready = threading.Event()

        def read(proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.log += line
                if READY in line:
                    ready.set()

        threading.Thread(target=read, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.1):
            assert self.proc.poll() is None, f"the service exited {self.proc.returncode}:\n{self.log}"
            assert time.monotonic() < deadline, f"the service did not start:\n{self.log}"
        return self

    def kill(self) -> None:
        """kill -9 (what a crash or an OOM kill does)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, as a supervisor stops it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def client(self, key: str) -> Any:
        """The real openai SDK aimed at the service."""
        import openai

        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=60)


def write_config(folder: Path, models: dict[str, Any], **fields: Any) -> Path:
    """The service's config file."""
    path = folder / "batch-service.yaml"
    path.write_text(yaml.safe_dump({"models": models, **fields}))
    return path


def wait_batch(client: Any, batch_id: str, timeout_s: float = 180, until: tuple[str, ...] = ()) -> Any:
    """Poll the batch (as a client does) until it is final, or in one of ``until``."""
    final = ("completed", "failed", "cancelled", "expired", *until)
    return wait_until(
        f"batch {batch_id} to be one of {final}",
        lambda: client.batches.retrieve(batch_id),
        until=lambda batch: batch.status in final,
        timeout_s=timeout_s,
    )


def lines_of(client: Any, file_id: str | None) -> list[dict[str, Any]]:
    """The JSON lines of a file of the service (none for no file)."""
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def chat_line(cid: str, model: str = "stub-model", **body: Any) -> dict[str, Any]:
    """One chat request line."""
    msg = [{"role": "user", "content": f"hello {cid}"}]
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": msg, "max_tokens": 8, **body},
    }


def jsonl(path: Path, lines: list[Any]) -> Path:
    """Write ``lines`` as JSONL (a str is written as it is)."""
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path
