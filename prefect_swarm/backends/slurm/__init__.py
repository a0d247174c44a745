"""The Slurm backend.

``client`` talks to Slurm (sbatch/squeue/sacct/scancel), ``render`` writes the sbatch scripts and
the nginx config (pure), ``serving`` and ``compute`` implement the two protocols, ``lb`` is the
reconciler that runs inside the load-balancer job.
"""
