"""nbgrader configuration of the course (measured with nbgrader 0.9.6).

solutions/ is the nbgrader source: assignment ``notebooks`` (solutions/notebooks/, the labs) is
released to ./notebooks/ and assignment ``assessments`` (solutions/assessments/) to
./assessments/. Grading state (submissions, autograded copies, feedback, the gradebook) lives
under the gitignored grading/ folder.
"""

import os

c = get_config()  # noqa: F821 - provided by nbgrader/traitlets

here = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.root = here
c.CourseDirectory.course_id = "multigpu"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "."
c.CourseDirectory.submitted_directory = "grading/submitted"
c.CourseDirectory.autograded_directory = "grading/autograded"
c.CourseDirectory.feedback_directory = "grading/feedback"
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(here, "grading", "gradebook.db")

# Training cells run for minutes, not nbgrader's default 30 s. The assessment's grading cell
# launches the learner's 4-worker run and bounds it itself (multigpu.grading); this is the
# outer limit per cell, after which nbgrader marks the cell as failed and goes on.
c.Execute.timeout = 1800
c.Execute.interrupt_on_timeout = True

# A learner's edited training script must survive autograde (nbgrader would otherwise replace
# it with the starter copy from solutions/assessments/).
c.Autograde.exclude_overwriting = {"assessments": ["train.py"]}

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
