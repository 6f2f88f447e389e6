"""The final assessment's grading.

A grading (:func:`grader.grade`) runs in this order, each stage in its own module:

    hints         check: the source exists and compiles (else nothing runs); later, its hints
    preparation   prepare: devices, the training set, the grader's own held-out set, the sandbox's
                  rules, Horovod's check where submissions run, the submission's scratch copy
    baselines     the unmodified starter on one worker with one thread, before and after the run
    runs          the run: horovodrun -np N in the sandbox (runner, sandbox), watched from outside:
                  the training files it opens (reads, on this grading's private view of the data
                  set) and the TCP connections between its processes (connections); its failure,
                  its images/s
    evidence      collect: one read-only record of the run, its checkpoints (checkpoints), Horovod's
                  timeline read for gradient rounds (averaging), what the grader saw from outside
                  set against what the ranks claimed (observations), the baselines
    criteria      judge: workers, identical, sharded, accuracy, throughput, one module each
    result        the verdicts (Criterion, GradeResult), saved as JSON; GradingUnavailable
    review        what no check inside the run can prove: the source read for capabilities
                  (capabilities, review_rules, review_training, review_flow) and what the grader saw
                  of the run (observations, workprobe); flags that hold a pass
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
    variants      broken and cheating submissions as edits of the reference (tests, calibrate): the
                  reference's lines they edit (edits), honest conversions (honest), three kinds of
                  cheating with two disguises each (disguises)
    cli           the ``multigpu`` verbs of all of the above

The certificates that official results earn are the next layer's (:mod:`multigpu.credential`).
"""
