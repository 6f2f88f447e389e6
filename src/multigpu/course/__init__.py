"""The course's tooling: code that works on the course's folders, not on a model.

``layout`` (where the course root is and what its folders are called; the rest take the root
from it or as an argument), ``release`` (learner copies, the gradebook, collecting
submissions: ``make release``), ``hygiene`` (notebooks without outputs or volatile metadata:
``make clean-notebooks``) and ``bench`` (the performance figures against their targets: ``make
bench``). All of it is reached through the one command, ``multigpu <verb>`` (:mod:`multigpu.cli`);
the grader's calibration is ``multigpu calibrate`` (:mod:`multigpu.grading.cli`), beside the
grader it calibrates.
"""
