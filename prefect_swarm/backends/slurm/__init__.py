"""The Slurm backend.

``config`` holds its config models and its entry in the table of backends, ``client`` talks to Slurm
(sbatch/squeue/sacct/scancel), ``render`` writes the sbatch scripts and the nginx config (pure, from
``templates/``), ``serving`` and ``compute`` implement the two protocols, ``members`` keeps the wanted
replica tasks in the queue, ``lb`` is the reconciler that runs inside the load-balancer job.
"""
