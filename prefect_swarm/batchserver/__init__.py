"""An OpenAI-compatible Batch API (``/v1/files``, ``/v1/batches``) served by swarms.

``prefect-swarm serve batches -c batch-service.yaml`` starts it: clients use the ``openai`` SDK as
against OpenAI; each batch runs as a job on its model's swarm (:mod:`.runner`), exactly once, and its
state lives in ``$PREFECT_SWARM_HOME/batch-service`` (:mod:`.store`). Modules: :mod:`.config` (the
service's config), :mod:`.validate` (a batch file checked as OpenAI checks it), :mod:`.app` (the
HTTP routes), :mod:`.output` (the output and error files), :mod:`.runner`.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8484

log = logging.getLogger("prefect_swarm.batchserver")


def serve(
    config: Path | None,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    certfile: Path | None = None,
    keyfile: Path | None = None,
) -> None:
    """Run the service in the foreground until SIGINT/SIGTERM (the runner and its swarms go with it;
    the jobs in flight keep running and are picked up by the next start)."""
    from aiohttp import web

    from prefect_swarm.batchserver.app import ACCESS_LOG_FORMAT, make_app
    from prefect_swarm.batchserver.config import load_service
    from prefect_swarm.batchserver.runner import BatchRunner
    from prefect_swarm.batchserver.store import ServiceStore

    svc = load_service(config)
    if svc.cfg.prefect_deployment:
        from prefect_swarm.batchserver.prefect_runs import api_configured
        from prefect_swarm.exceptions import ConfigError

        if not api_configured():
            raise ConfigError(
                f"the batch service config names the deployment '{svc.cfg.prefect_deployment}' but no Prefect API "
                "is configured: set PREFECT_API_URL (e.g. http://127.0.0.1:4200/api), or remove prefect_deployment "
                "to run batches as jobs of the service itself."
            )
    store = ServiceStore()
    runner = BatchRunner(store, svc)
    context = None
    if certfile is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certfile, keyfile)
    scheme = "https" if context else "http"
    logging.getLogger("aiohttp.access").setLevel(logging.INFO)
    web.run_app(
        make_app(store, svc, runner),
        host=host,
        port=port,
        ssl_context=context,
        access_log_format=ACCESS_LOG_FORMAT,
        print=lambda _: log.warning(
            "batch service on %s://%s:%d (models: %s)", scheme, host, port, ", ".join(sorted(svc.swarms)) or "none"
        ),
        handle_signals=True,
    )
