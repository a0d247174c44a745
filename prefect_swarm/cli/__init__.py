"""The ``prefect-swarm`` command line (typer + rich). See :mod:`prefect_swarm.cli.main`.

Importing it registers the Prefect layer's word with holding (:mod:`prefect_swarm.tasks.word`: flow
run states and block secrets, Prefect imported only when asked), so every command's
:func:`~prefect_swarm.holding.default_holding` has it.
"""

from prefect_swarm import tasks as tasks
