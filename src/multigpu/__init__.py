"""multigpu: the shared code of the course "Training deep learning models on multiple GPUs".

Notebooks import from here instead of pasting code. The folders are layers, each importing only
from the ones above it in this list (docs/architecture.md; tests/test_imports.py keeps it so):

=====================  ==================================================================
``core``               ``devices`` (GPU or CPU mode, threads, pinning), ``data`` (the JPEG
                       data set and its loaders), ``models`` (AlexNet), ``training`` (one
                       training loop for 1..N workers), ``schedules`` (the one learning-rate
                       rule: linear scaling with warm-up), ``meters``, ``notebook`` (quick
                       mode, progress bars), ``exercises`` (an answer that calls the course's
                       own is not the learner's), ``layout`` (where the course's folders are)
``running``            ``launch`` (every child process: bounded in time, clear errors),
                       ``supervisor`` (the one watcher of child processes), ``environment``
                       (a worker's environment, the Horovod settings),
                       ``hvdtools`` (Horovod jobs, an all-reduce timer, the learner's script
                       composed and run), ``run_records`` (the scripts' per-rank records,
                       scaling tables), ``timeline`` (Horovod's timeline),
                       ``scripts.train_horovod`` / ``train_ddp`` / ``train_elastic``
``labs.lab1``          Lab 1 (GD vs SGD): ``toy``, ``gradient_noise``, ``batching``,
                       ``large_batch`` (LARS), ``scaling_rule`` (the rule's experiment),
                       ``staleness`` (asynchronous SGD's stale gradients, stragglers),
                       ``accumulation`` (gradient accumulation, activation memory)
``labs.lab2``          Lab 2 and 2b: ``profiling`` (where one device's time goes),
                       ``step_options`` (one device's step made faster), ``paramserver``
                       (naive data parallelism), ``ring``, ``scaling_model`` (its tables in
                       ``scaling_model_data``)
``labs.lab3``          Lab 3 (Horovod): ``record_checks`` (facts of a correct run), ``syncbn``
                       (BatchNorm over the global batch, plain against synchronised),
                       ``backward_passes`` (accumulation with one all-reduce per step)
``labs.lab4``          Lab 4 (beyond a box): ``links`` (an emulated network link),
                       ``multinode``, ``elastic`` (a worker killed mid-epoch), ``costs``,
                       ``parallelism`` (a 2-stage pipeline against data parallelism)
``labs.lab5``          Lab 5 (beyond one device's memory): ``memory``, ``collectives``,
                       ``zero`` (stage 1), ``sharded_gradients`` (stage 2), ``fully_sharded``
                       (stage 3), ``tensor_parallel``, ``pipeline``, ``checkpointing``,
                       ``layouts``, ``bytes_sent``
``figures``            ``plots``, ``reference`` (the reference run's figures, shipped in
                       ``reference_runs/``, printed beside the learner's own)
``grading``            the assessment: rules, the sandboxed runner, the grader (a pipeline of
                       criteria), review flags, the audit trail, the official grading,
                       what the grader observes from outside a run, broken variants
``credential``         the certificate: the course key, issuing, verifying, revoking (Open
                       Badges 3.0, a signed status list), the issuer files it publishes
``course``             ``release`` (learner copies, gradebook, collect), ``hygiene`` (clean
                       notebooks), ``bench`` (``make bench``)
``workshop``           one JupyterHub for a room of learners: accounts, nbgrader's exchange,
                       the grading queue
``cli``                the one ``multigpu <verb>`` command
=====================  ==================================================================
"""

__version__ = "0.1.0"
