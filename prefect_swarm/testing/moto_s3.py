"""A real S3 API on loopback: ``moto_server`` (moto in server mode) on a free port, stopped by its pid.

    with MotoS3() as s3:                 # moto[server] installed (the test extra)
        s3.create_bucket("data")
        env = s3.env()                   # AWS_* variables pointing any S3 client at it
        ...
    # the server process is stopped

Any S3 client talks to it: pyarrow's ``S3FileSystem`` (through ``AWS_ENDPOINT_URL``), boto3, the
job processes started with :meth:`MotoS3.env` in their environment. Credentials are dummies.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Self

from prefect_swarm.testing.ports import free_port


class MotoS3:
    """One ``moto_server`` process on ``127.0.0.1:<port>`` (a free port unless given)."""

    def __init__(self, port: int | None = None, region: str = "us-east-1") -> None:
        self.port = port or free_port()
        self.region = region
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The endpoint URL."""
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment variables pointing S3 clients at this server (dummy credentials)."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self, timeout: float = 60) -> Self:
        """Start the server and wait until it answers."""
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with code {self.proc.returncode}; is moto[server] installed?")
            try:
                with urllib.request.urlopen(self.url + "/moto-api/", timeout=2):
                    return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto_server did not answer on {self.url} within {timeout} s")

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (an S3 PUT of the bucket)."""
        req = urllib.request.Request(f"{self.url}/{name}", method="PUT")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def stop(self) -> None:
        """Stop the server process (by its pid)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, 9)
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.stop()
