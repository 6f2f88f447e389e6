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
    spawnqueue a room logging in at once: servers start a few at a time, the others wait
    busykernels  a server extension: a kernel running a job counts as activity (the idle culler)
    proxy      configurable-http-proxy as a process of its own, left alone by hub restarts
    tls        HTTPS: a self-signed pair on request, a pair checked before it is served
    issuer     the certificates' public key and status list, served where the certificates say
    preflight  make hub-check: what the box lacks for a room of N
    offboard   after the workshop: each learner's work and results archived, then the account removed
    scratch    a whole hub in a temporary root (tests and the room load test)
    learnerclient  one learner, driven as their browser drives the hub
    roomload, roomreport, memory   the room load test (make hub-load) and its report
    cli        ``multigpu workshop VERB``
"""
