"""The final assessment's grading.

A grading (:func:`grader.grade`) runs in this order, each stage in its own module:

    hints         check: the source exists and compiles (else nothing runs); later, its hints
    preparation   prepare: devices, the training set, the grader's own held-out set, the sandbox's
                  rules, Horovod's check where submissions run, the submission's scratch copy
    baselines     the unmodified starter on one worker with one thread, before and after the run
    runs          the run: horovodrun -np N in the sandbox (runner, sandbox), its failure, its images/s
    evidence      collect: one read-only record of the run, its checkpoints (checkpoints), Horovod's
                  timeline read for gradient rounds (averaging), the baselines
    criteria      judge: workers, identical, sharded, accuracy, throughput, one module each
    result        the verdicts (Criterion, GradeResult), saved as JSON; GradingUnavailable
    review        what no check inside the run can prove, read from the source: flags that hold a pass
    audit         what was graded by which grader (SHA-256, version, the kept source)
    grader        grade(), judge(), deferred(): the pipeline, and the names callers use

Around it:

    rules         the pass rule: profiles, thresholds, the course key's path
    starter       the single-device script learners convert (released as assessments/train.py)
    sandbox       bubblewrap around every untrusted run
    runner        one bounded run of an untrusted script (time, output, memory, no process left)
    regrade       grade a stored result's source again: does the verdict hold?
    official      the instructor's grading of collected submissions, results, review decisions
    similarity    pairs of a cohort's submissions that share most of their code
    variants      broken and cheating submissions as edits of the reference (tests, calibrate)
    cli           the ``multigpu`` verbs of all of the above

The certificates that official results earn are the next layer's (:mod:`multigpu.credential`).
"""
