"""multigpu: the shared code of the course "Training deep learning models on multiple GPUs".

Notebooks import from here instead of pasting code. Which module serves which lab:

=====================  ==================================================================
every lab              ``devices`` (GPU or CPU mode, threads, pinning), ``data`` (the JPEG
                       data set and its loaders), ``models`` (AlexNet), ``training`` (one
                       training loop for 1..N workers), ``meters``, ``notebook`` (quick
                       mode, progress bars), ``plots``, ``launch`` (every child process:
                       bounded in time, clear errors)
Lab 0 (welcome)        ``devices``, ``launch``
Lab 1 (GD vs SGD)      ``toy``, ``gradient_noise``, ``batching``, ``schedules`` (the one
                       learning-rate rule: linear scaling with warm-up), ``large_batch``
                       (LARS: a trust ratio per layer), ``scaling_rule`` (the rule's
                       experiment: 4x below the noise scale, 64x past it, LARS there)
Lab 2 (pipeline)       ``profiling`` (where one device's time goes), ``paramserver`` (naive
                       data parallelism), ``scaling_model``, ``ring`` (Lab 2b)
Lab 3 (Horovod)        ``hvdtools`` (an all-reduce timer, composing the learner's script,
                       running it), ``run_records`` (the scripts' per-rank records, scaling
                       tables), ``record_checks`` (facts of a correct run), ``timeline``,
                       ``scripts.train_horovod`` / ``scripts.train_ddp`` (sharing
                       ``scripts.common``)
Lab 4 (beyond a box)   ``links`` (a Horovod job behind an emulated network link: a
                       rate-limited loopback in a namespace of its own), ``multinode``
                       (the multi-node command, checked; 2 hosts on one machine),
                       ``elastic`` (a worker killed mid-epoch, the sample ledger;
                       ``scripts.train_elastic``), ``costs`` (time and cost on 1..N
                       GPUs, spot interruptions with and without checkpoints)
the assessment         ``grading`` (rules, the sandboxed runner, the grader, review flags,
                       the audit trail, the official grading, certificates as Open Badges
                       3.0 with revocation, broken variants)
workshops              ``workshop`` (one JupyterHub for a room of learners: accounts,
                       nbgrader's exchange, the grading queue)
every lab's figures    ``reference`` (the reference run's figures, shipped in
                       ``reference_runs/``, printed beside the learner's own)
course tooling         ``course``: ``layout`` (where the course's folders are),
                       ``release`` (learner copies, gradebook, collect), ``hygiene``
                       (clean notebooks), ``bench`` (``make bench``); ``cli`` (the one
                       ``multigpu <verb>`` command)
=====================  ==================================================================
"""

__version__ = "0.1.0"

