"""External compute: jobs against an external endpoint run as processes on this machine (the local
compute backend), with the endpoint's key from where the swarm's config says (see serving)."""

from __future__ import annotations

from prefect_swarm.backends.external.serving import external_key
from prefect_swarm.backends.local.compute import LocalCompute
from prefect_swarm.interfaces import JobEnv, JobRequest


class ExternalCompute(LocalCompute):
    """LocalCompute whose shards get the external endpoint's key (``api_key`` or ``$api_key_env``)."""

    backend = "external"

    def job_secret_env(self, request: JobRequest) -> dict[str, str]:
        """The endpoint's key, then the request's secrets; through the environment only."""
        return {**JobEnv(api_key=external_key(self.cfg)).secret_env(), **request.secret_env}
