"""The external backend: a swarm that is an OpenAI-compatible endpoint someone else runs. ``config`` holds
its config model and its entry in the table of backends, ``serving`` checks and reports the endpoint,
``compute`` runs jobs as local subprocesses."""
