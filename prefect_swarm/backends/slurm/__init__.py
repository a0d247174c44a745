"""The Slurm backend.

``client`` talks to Slurm (sbatch/squeue/sacct/scancel), ``render`` writes the sbatch scripts and
the nginx config (pure), ``serving`` and ``compute`` implement the two protocols, ``members``
keeps the wanted replica tasks in the queue, ``lb`` is the reconciler that runs inside the
load-balancer job.
"""
