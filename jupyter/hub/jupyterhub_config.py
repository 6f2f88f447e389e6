"""JupyterHub's configuration for a workshop: ``make hub`` runs ``jupyterhub -f`` on this file.
Everything is in :mod:`multigpu.workshop.hubconfig`; settings come from the environment."""

from multigpu.workshop import hubconfig

hubconfig.configure(c)  # noqa: F821 - c is JupyterHub's config object
