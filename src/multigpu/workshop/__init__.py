"""Workshops on one JupyterHub (``make hub``; docs/workshop.md is the instructor's guide).

    layout     the hub's folders under one root (default /srv/multigpu): course, exchange, state
    accounts   learner and instructor accounts: real Unix users, a sheet of one-time passwords
    course     the hub's nbgrader course: one assignment per lab and the assessment, the exchange
    limits     a fair share of the box per learner server (cgroups), the grading queue's cores
    hubconfig  JupyterHub's configuration: PAM, the local process spawner, the grading service
    jobs       the grading queue on disk (SQLite): survives a restart, one grading at a time
    grading    one job: autograde a lab as an unprivileged user, the assessment's official
               grading, feedback, a certificate
    service    the hub service that watches submissions, runs the queue and shows each learner
               their place and result
    cli        ``multigpu workshop VERB``
"""
