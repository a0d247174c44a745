"""The ``prefect-swarm`` command line (typer + rich). See :mod:`prefect_swarm.cli.main`."""
