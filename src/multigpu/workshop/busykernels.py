"""A Jupyter server extension for the hub's servers: a kernel that runs a job counts as activity.

The hub's idle culler (``jupyterhub-idle-culler``, ``hubconfig``) stops servers whose last
activity is older than its timeout. A server's activity is what it reports to the hub: requests,
kernel messages, terminal output. A training cell that prints nothing for an hour sends none of
them, and its server would be culled in the middle of the job. This extension looks at the
server's kernels every :data:`INTERVAL_S` seconds and, while any is busy (executing), records now
as activity (jupyter_server counts every ``*_last_activity`` setting), which the server reports to
the hub like any other. An idle kernel adds nothing: a server left idle is still culled.

Enabled for the hub's servers only (``hubconfig.server_env``: ``--ServerApp.jpserver_extensions``).
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

#: Seconds between looks at the kernels (``MULTIGPU_BUSY_INTERVAL``; well under the culler's timeout).
INTERVAL_S = 10
SETTING = "multigpu_busy_kernels_last_activity"


def busy(kernel_manager: Any) -> bool:
    """Whether any kernel of the server is executing."""
    for kernel_id in list(kernel_manager.list_kernel_ids()):
        try:
            if getattr(kernel_manager.get_kernel(kernel_id), "execution_state", None) == "busy":
                return True
        except KeyError:  # shut down since the list was taken
            continue
    return False


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "multigpu.workshop.busykernels"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from tornado.ioloop import PeriodicCallback

    settings = serverapp.web_app.settings

    def tick() -> None:
        if busy(serverapp.kernel_manager):
            settings[SETTING] = dt.datetime.now(dt.timezone.utc)

    interval = float(os.environ.get("MULTIGPU_BUSY_INTERVAL") or INTERVAL_S)
    callback = PeriodicCallback(tick, interval * 1000)
    callback.start()
    settings["multigpu_busy_kernels_callback"] = callback  # kept alive with the app
    serverapp.log.info("multigpu: a busy kernel counts as activity (checked every %g s)", interval)
