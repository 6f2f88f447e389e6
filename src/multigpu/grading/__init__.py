"""The final assessment's grading, in the order a grading runs:

    rules         the pass rule: profiles, thresholds, the course key's path
    starter       the single-device script learners convert (released as assessments/train.py)
    sandbox       bubblewrap around every untrusted run
    runner        one bounded run of an untrusted script (time, output, memory, no process left)
    grader        prepare, baselines, the run, the evidence, the criteria: a verdict
    review        what no check inside the run can prove, read from the source: flags that hold a pass
    audit         what was graded by which grader (SHA-256, version, the kept source)
    regrade       grade a stored result's source again: does the verdict hold?
    official      the instructor's grading of collected submissions, results, review decisions
    similarity    pairs of a cohort's submissions that share most of their code
    certificates  signed certificates from the official results (Open Badges 3.0: openbadges;
                  revocation: status_list; the verification page: verify.html)
    variants      broken and cheating submissions as edits of the reference (tests, calibrate)
    cli           the ``multigpu`` verbs of all of the above
"""
