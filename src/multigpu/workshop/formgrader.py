"""nbgrader's formgrader on the instructor's server, kept from serving a learner's page as the instructor's.

The formgrader serves files below ``/formgrader/submissions/<id>/`` (its ``SubmissionFilesHandler``,
there for the images of an autograded notebook) as whatever type their names say, on the hub's
origin, and with ``..%2F`` in the URL any file of the course. Learners write some of those files:
a ``k.html`` submitted with a lab reaches ``autograded/`` (nbgrader's autograde copies every file
of a submission) and ``submitted/``, and nbgrader's feedback page holds the HTML of the learner's
markdown. A link in the learner's notebook (``[my plot](k.html)``, relative to the formgrader's page
of that notebook) then opens the learner's script as the instructor, who can read the solutions
and change every grade.

This server extension (``jupyter/instructor`` enables it) makes that handler serve only files
under the course's ``autograded/`` folder, each with ``Content-Security-Policy: sandbox`` (a unique
origin, no script, no form): an image still shows in the formgrader's page, a page shows inert.
"""

from __future__ import annotations

import os
from typing import Any

#: Added to the formgrader's policy for every file it serves from a submission.
SANDBOX = "sandbox"


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "multigpu.workshop.formgrader"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    guard()
    serverapp.log.info("multigpu: the formgrader serves submission files sandboxed, from autograded/ only")


def guard() -> None:
    """Change nbgrader's ``SubmissionFilesHandler`` (the class, so it holds whichever extension
    loads first) as the module doc says."""
    from nbgrader.server_extensions.formgrader.handlers import SubmissionFilesHandler
    from tornado import web

    if getattr(SubmissionFilesHandler, "multigpu_guarded", False):
        return
    base_policy = SubmissionFilesHandler.content_security_policy
    base_validate = SubmissionFilesHandler.validate_absolute_path

    def content_security_policy(self: Any) -> str:
        return f"{base_policy.fget(self)}; {SANDBOX}"

    def validate_absolute_path(self: Any, root: str, absolute_path: str) -> str | None:
        autograded = os.path.join(os.path.realpath(os.path.join(self.coursedir.root,
                                                                self.coursedir.autograded_directory)), "")
        if not os.path.realpath(absolute_path).startswith(autograded):
            raise web.HTTPError(404)
        return base_validate(self, root, absolute_path)

    setattr(SubmissionFilesHandler, "content_security_policy", property(content_security_policy))
    setattr(SubmissionFilesHandler, "validate_absolute_path", validate_absolute_path)
    setattr(SubmissionFilesHandler, "multigpu_guarded", True)
