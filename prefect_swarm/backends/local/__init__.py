"""The local backend: replicas are engine processes on this machine, each under the watchdog; jobs
are local subprocesses. ``config`` holds its config model and its entry in the table of backends,
``serving`` and ``compute`` implement the two protocols; ``processes`` finds and stops the processes
they start."""
