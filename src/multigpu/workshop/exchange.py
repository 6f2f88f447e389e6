"""nbgrader's submit for the hub's learners (``ExchangeFactory.submit`` in their nbgrader config):
the submission's folder in the exchange is the learner's alone from the moment it exists.

A full exchange (its disk quota, ``disks``), or on a hub a learner's full home (their inbound
folder is in it: ``inbound``), refuses the submission with a message that says which, and leaves
no half-copied folder to grade.

nbgrader makes it world-writable (777, so that an instructor may delete it); then anyone who
learns its name can read and replace the learner's work before it is graded. On the hub nobody
else needs it: the grading service copies it as root when it arrives (:mod:`submissions`), and
closes it too, for a learner who submits another way.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import tempfile

from nbgrader.exchange.default.submit import ExchangeSubmit


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's ``ExchangeSubmit`` with the same checks and files, made 700/600 before they are in
    the exchange: the submission is prepared in a private folder, then copied into a folder of the
    inbound exchange that was made mode 700."""

    def copy_files(self) -> None:
        self.init_release()
        self.check_filename_diff()
        dest = os.path.join(self.inbound_path, self.assignment_filename)
        cache = os.path.join(self.cache_path, self.assignment_filename.rsplit("+", 1)[0] if self.add_random_string
                             else self.assignment_filename)
        self.log.info("Source: %s", self.src_path)
        self.log.info("Destination: %s", dest)
        mask = os.umask(0o077)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                staged = os.path.join(tmp, "submission")
                self.do_copy(self.src_path, staged)
                for name, text in (("timestamp.txt", self.timestamp), ("submission_secret.txt", secrets.token_hex(64))):
                    with open(os.path.join(staged, name), "w") as fh:
                        fh.write(text)
                self.set_perms(staged, fileperms=0o600, dirperms=0o700)
                os.mkdir(dest, 0o700)
                try:
                    shutil.copytree(staged, dest, dirs_exist_ok=True)
                except OSError as e:  # shutil.Error (an OSError) gathers each file's error as text
                    if e.errno not in (errno.ENOSPC, errno.EDQUOT) and not any(
                            os.strerror(n) in str(e) for n in (errno.ENOSPC, errno.EDQUOT)):
                        raise
                    shutil.rmtree(dest, ignore_errors=True)  # half a submission is none: nothing to grade
                    self.fail(self.full_message())
                os.makedirs(self.cache_path, exist_ok=True)
                shutil.copytree(staged, cache)
        finally:
            os.umask(mask)
        self.log.info("Submitted as: %s %s %s", self.coursedir.course_id, self.coursedir.assignment_id, self.timestamp)

    def full_message(self) -> str:
        """Why the submission did not fit: on a hub, a learner's inbound folder is in their own home
        (``multigpu.workshop.inbound``); elsewhere the exchange is the course's."""
        sent = "your submission was NOT sent, and your work is safe in your home folder"
        if os.stat(self.inbound_path).st_dev == os.stat(os.path.expanduser("~")).st_dev:
            return (f"your home folder is full: a submission waits in it until it is graded, and there is no space "
                    f"left for this one: {sent}. Delete files you no longer need (du -sh ~/* shows the largest), "
                    "then submit again.")
        return (f"the course's exchange is full (no space left on its disk): {sent}. Tell your instructor, who can "
                "free the exchange (docs/workshop.md, disk quotas), then submit again.")
