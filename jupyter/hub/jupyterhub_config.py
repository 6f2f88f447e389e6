"""JupyterHub's configuration for a workshop: ``make hub`` runs ``jupyterhub -f`` on this file.
Everything is in :mod:`multigpu.workshop.hubconfig`; settings come from the environment.
``MULTIGPU_SPAWNER=slurm`` (``make hub SPAWNER=slurm``): servers as Slurm jobs (:mod:`multigpu.workshop.slurmhub`)."""

import os

from multigpu.workshop import hubconfig, slurmhub

if os.environ.get("MULTIGPU_SPAWNER", "local") == "slurm":
    slurmhub.configure(c)  # noqa: F821 - c is JupyterHub's config object
else:
    hubconfig.configure(c)  # noqa: F821
