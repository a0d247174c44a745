"""A real S3 API on loopback: ``moto_server`` (moto in server mode) on a free port, stopped by its pid.

    with MotoS3() as s3:                 # moto[server] installed (the test extra)
        s3.create_bucket("data")
        env = s3.env()                   # AWS_* variables pointing any S3 client at it
        ...
    # the server process is stopped

Any S3 client talks to it: pyarrow's ``S3FileSystem`` (through ``AWS_ENDPOINT_URL``), boto3, the
job processes started with :meth:`MotoS3.env` in their environment. Credentials are dummies.

With ``iam=True`` the server checks every request as IAM would (moto's
``INITIAL_NO_AUTH_ACTION_COUNT``): the first three requests create an admin user (``s3:*``, ``iam:*``)
whose keys :meth:`MotoS3.env` hands out; :meth:`MotoS3.add_user` makes users with fewer rights (a
read-only one, say). An unknown access key or a wrong secret is then refused as by AWS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import Any, Self

from prefect_swarm.testing.ports import free_port

_ADMIN_SETUP_ACTIONS = 3
"""Requests the server takes unchecked with ``iam``: creating the admin user, its key, its policy."""

_MOTO_OPERATION_ACTIONS = {
    "s3:ListBucket": ("s3:ListObjects", "s3:ListObjectsV2", "s3:HeadBucket"),
    "s3:GetObject": ("s3:HeadObject",),
}
"""What AWS covers with one IAM action and moto (5.2.6 at least) checks as actions of their own.

AWS authorizes ListObjects(V2) and HeadBucket with ``s3:ListBucket``, and HeadObject with
``s3:GetObject`` (the S3 API reference of each operation); ``s3:HeadObject``, ``s3:HeadBucket`` and
``s3:ListObjectsV2`` are not IAM actions at all. moto 5.2.6 checks the operation's own name, so a
user granted only the AWS actions is refused a HEAD that AWS would answer. :meth:`MotoS3.add_user`
grants the operation names beside the AWS action, so the server refuses exactly what AWS would
(it is harmless with a moto that checks the AWS action).
"""


class MotoS3:
    """One ``moto_server`` process on ``127.0.0.1:<port>`` (a free port unless given)."""

    def __init__(self, port: int | None = None, region: str = "us-east-1", *, iam: bool = False) -> None:
        self.port = port or free_port()
        self.region = region
        self.iam = iam
        self.keys = ("testing", "testing")
        """The access key id and secret of :meth:`env` (the admin user's with ``iam``)."""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The endpoint URL."""
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment variables pointing S3 clients at this server (dummy credentials)."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": self.keys[0],
            "AWS_SECRET_ACCESS_KEY": self.keys[1],
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self, timeout: float = 60) -> Self:
        """Start the server and wait until it answers."""
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_ADMIN_SETUP_ACTIONS)} if self.iam else None
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with code {self.proc.returncode}; is moto[server] installed?")
            try:
                with urllib.request.urlopen(self.url + "/moto-api/", timeout=2):
                    pass
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
                continue
            if self.iam:
                self.keys = self._add_user("admin", ["s3:*", "iam:*"])
            return self
        self.stop()
        raise RuntimeError(f"moto_server did not answer on {self.url} within {timeout} s")

    def client(self, service: str = "s3", keys: tuple[str, str] | None = None) -> Any:
        """A boto3 client of this server (the admin's keys unless ``keys``)."""
        import boto3

        key_id, secret = keys or self.keys
        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name=self.region,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
        )

    def add_user(self, name: str, actions: list[str]) -> dict[str, str]:
        """An IAM user allowed only ``actions`` (AWS IAM actions, on every resource); :meth:`env` with its keys."""
        granted = [*actions, *(op for action in actions for op in _MOTO_OPERATION_ACTIONS.get(action, ()))]
        key_id, secret = self._add_user(name, granted)
        return {**self.env(), "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret}

    def _add_user(self, name: str, actions: list[str]) -> tuple[str, str]:
        iam = self.client("iam")  # three requests (the admin's are the server's unchecked ones)
        iam.create_user(UserName=name)
        key = iam.create_access_key(UserName=name)["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
        iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy", PolicyDocument=json.dumps(policy))
        return key["AccessKeyId"], key["SecretAccessKey"]

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (an S3 PUT of the bucket; signed by the admin with ``iam``)."""
        if self.iam:
            self.client().create_bucket(Bucket=name)
            return
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
