# The course's commands. The two a learner needs: `make lab` and `make test`.
# Every target builds the environment first when it is missing (make setup).

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.setup-done
PORT   ?= 8888
IP     ?= 127.0.0.1
# instructor targets: SUBMISSIONS=folder-or-zip, STUDENT=id
SUBMISSIONS ?= submissions
# Jupyter refuses to run as root without this; containers and most cloud GPU images run as root
ALLOW_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo --ServerApp.allow_root=True)
# the venv's tools first (nbgrader calls `alembic`, notebooks call `horovodrun`)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: sandbox-deps help setup lab lab-instructor test test-fast test-matrix lint data info release check-release \
        clean-notebooks check-notebooks course bench test-deps calibrate collect autograde feedback \
        grades certificates grade-me clean browser-deps test-browser gpu-check

help:
	@echo "make lab             start JupyterLab on the course (learner view; builds the environment first)"
	@echo "make test            check everything: unit tests, Horovod jobs, every notebook, nbgrader round trip"
	@echo "make lint            ruff over src/ and tests/, mypy over src/ (pyproject.toml): zero findings"
	@echo "make setup           create .venv (Python 3.11), install the pinned packages, build Horovod"
	@echo "make info            show the hardware mode, cores/GPUs and the Horovod build"
	@echo "make data            generate the course's JPEG data set (once)"
	@echo "make release         regenerate learner copies (notebooks/, assessments/) from solutions/"
	@echo "make check-release   fail when learner copies differ from what make release generates"
	@echo "make clean-notebooks strip outputs and volatile metadata (check-notebooks only checks)"
	@echo "make lab-instructor  JupyterLab with the nbgrader formgrader on solutions/"
	@echo "make test-deps       install what the browser tests need (Debian chromium, playwright)"
	@echo "make test-browser    end-to-end test of the learner view in headless Chromium (make browser-deps installs it)"
	@echo "make bench           speed, scaling efficiency and grading cost against their targets (bench/results.md)"
	@echo "make test-cluster    as root after make cluster-deps: the course's jobs and gradings on a real 2-node Slurm test cluster"
	@echo "make gpu-check       on a GPU machine: every path a GPU changes, run once (bench/gpu-check.md)"
	@echo "make grade-me        the official grader's verdict on assessments/train.py"
	@echo "instructor: make collect SUBMISSIONS=dir|zip, autograde, feedback, grades, certificates"

# ---------------------------------------------------------------------------------- environment
setup: $(STAMP)

$(STAMP): pyproject.toml tools/install_horovod.sh tools/horovod-0.28.1.patch
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11 (or make setup PYTHON=/path/to/python3.11)"; exit 1; }
	@$(MAKE) --no-print-directory sandbox-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')
	$(BIN)/pip install --quiet --disable-pip-version-check -e .
	tools/install_horovod.sh $(PY)
	@touch $@
	@echo "environment ready in $(VENV)"

info: $(STAMP)
	$(BIN)/multigpu info

data: $(STAMP)
	$(BIN)/multigpu data

# ---------------------------------------------------------------------------------- learners
lab: $(STAMP)
	$(BIN)/multigpu info || true
	$(BIN)/multigpu data
	JUPYTER_CONFIG_PATH=$(CURDIR)/jupyter/learner \
	$(BIN)/jupyter lab --ServerApp.ip=$(IP) --ServerApp.port=$(PORT) --ServerApp.root_dir=$(CURDIR) $(ALLOW_ROOT) \
	    --LabApp.default_url=/lab/tree/notebooks/00-welcome.ipynb

# the instructor's view: formgrader, Create Assignment and course list on (jupyter/instructor/)
lab-instructor: $(STAMP)
	JUPYTER_CONFIG_PATH=$(CURDIR)/jupyter/instructor \
	$(BIN)/jupyter lab --ServerApp.ip=$(IP) --ServerApp.port=$(PORT) --ServerApp.root_dir=$(CURDIR) $(ALLOW_ROOT) \
	    --LabApp.default_url=/lab/tree/solutions

grade-me: $(STAMP)
	$(BIN)/multigpu grade assessments --echo

# ---------------------------------------------------------------------------------- checks
# everything; the browser tests need `make test-deps` first (they are skipped, with the reason, without it)
test: $(STAMP)
	MULTIGPU_QUICK=1 $(PY) -m pytest -m "not matrix and not cluster" --durations=15

# the gradings make test leaves out: one more variant of each failure kind it grades (about 10 min)
test-matrix: $(STAMP)
	MULTIGPU_QUICK=1 $(PY) -m pytest -m matrix --durations=10

# what the tests need beyond make setup: Debian's chromium and playwright for the browser tests
test-deps: browser-deps

# the tests not marked slow, in this one process: tests/conftest.py fails any of them that starts a process
test-fast: $(STAMP)
	MULTIGPU_QUICK=1 $(PY) -m pytest -m "not slow" --durations=10

# style and types: ruff over src/ and tests/, mypy over src/ (both configured in pyproject.toml)
lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# the grading sandbox (multigpu.grading.sandbox): Debian's bubblewrap; without it grading still
# gives learners a verdict, marked unsandboxed, but certificates are refused
sandbox-deps:
	@if ! command -v bwrap >/dev/null; then \
	    if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	    echo "installing bubblewrap (apt-get) for the grading sandbox"; \
	    { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq bubblewrap >/dev/null; } \
	    || echo "could not install bubblewrap (needs root or passwordless sudo): grading runs unsandboxed, no certificates"; \
	fi

# the browser test (tests/test_browser.py): Debian's chromium (no browser download) + playwright
CHROMIUM ?= /usr/bin/chromium
PLAYWRIGHT_VERSION := 1.65.2

browser-deps: $(STAMP)
	@if [ ! -x $(CHROMIUM) ]; then \
	    if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	    echo "installing chromium (apt-get) for the browser test"; \
	    { $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; } \
	    || echo "could not install chromium (needs root or passwordless sudo): tests/test_browser.py will be skipped"; \
	fi
	@$(PY) -c "import importlib.metadata as m; raise SystemExit(m.version('playwright') != '$(PLAYWRIGHT_VERSION)')" 2>/dev/null \
	    || $(BIN)/pip install --quiet --disable-pip-version-check playwright==$(PLAYWRIGHT_VERSION)

test-browser: browser-deps
	MULTIGPU_QUICK=1 $(PY) -m pytest tests/test_browser.py -v

check-notebooks: $(STAMP)
	$(BIN)/multigpu clean-notebooks --check

clean-notebooks: $(STAMP)
	$(BIN)/multigpu clean-notebooks

# ---------------------------------------------------------------------------------- instructors
release: $(STAMP)
	$(BIN)/multigpu release
	@echo "learner copies regenerated in notebooks/ and assessments/: review and commit them"

check-release: $(STAMP)
	$(BIN)/multigpu release --check

course: $(STAMP)
	MULTIGPU_QUICK=0 $(PY) -m pytest tests/test_notebooks.py -s

collect: $(STAMP)
	$(BIN)/multigpu release --collect $(SUBMISSIONS)

# the assignments solutions/ holds (labs and assessment)
ASSIGNMENTS = $$($(BIN)/multigpu release --assignments)

# nbgrader runs the labs; the assessment's grade is the official, sandboxed grading of each train.py
# (multigpu grade-submissions), which replaces whatever the assessment notebook did in its kernel
autograde: $(STAMP)
	$(BIN)/multigpu release --gradebook
	@for a in $(ASSIGNMENTS); do echo "nbgrader autograde $$a"; \
	    MULTIGPU_OFFICIAL_GRADING=1 $(BIN)/nbgrader autograde $$a || exit 1; done
	$(BIN)/multigpu grade-submissions
	@echo "autograded copies in grading/autograded/, scores in grading/gradebook.db, assessment results in grading/results/"

feedback: $(STAMP)
	@for a in $(ASSIGNMENTS); do echo "nbgrader generate_feedback $$a"; $(BIN)/nbgrader generate_feedback $$a || exit 1; done
	@echo "feedback (HTML per student and notebook) in grading/feedback/"

grades: $(STAMP)
	$(BIN)/nbgrader export --to grading/grades.csv
	@echo "grades written to grading/grades.csv"

certificates: $(STAMP)
	$(BIN)/multigpu certify

calibrate: $(STAMP)
	$(BIN)/multigpu calibrate

# performance figures against their targets: bench/results.md and bench/results.json (~1 h;
# make bench BENCH_ARGS="--quick --only pipeline scaling" for a 2-minute look)
bench: $(STAMP)
	$(BIN)/multigpu bench $(BENCH_ARGS)

# every path a GPU changes, run once on this GPU machine (about 8 min on one GPU): bench/gpu-check.md;
# RECORD=1 makes the notebooks' figures the GPU reference run; without CUDA it says so and stops
# (GPU_CHECK_ARGS=--rehearse runs the same checks on the CPU). A GPU machine without a package
# index: tools/gpu_check_bundle.sh here, then tools/gpu_check_device.sh there (docs/gpu-check.md)
gpu-check: $(STAMP)
	$(BIN)/multigpu gpu-check $(if $(RECORD),--record) $(GPU_CHECK_ARGS)

clean:
	rm -rf grading/submitted grading/autograded grading/feedback .pytest_cache

# ---------------------------------------------------------------------------------- workshop hub
# A workshop on one JupyterHub (docs/workshop.md), as root on the workshop box: `make hub`.
# hub-deps installs, once, what only a hub needs: Node and npm (apt-get), configurable-http-proxy
# (npm) and a Python environment every learner account can run (HUB_PREFIX) with JupyterHub;
# `make test` installs none of it (CI runs `make hub-deps` before `make test` to run the hub tests).
# (MULTIGPU_HUB_PREFIX in the environment names it too: the hub tests read that variable)
HUB_PREFIX ?= $(or $(MULTIGPU_HUB_PREFIX),/opt/multigpu-hub)
HUB_ROOT   ?= /srv/multigpu
HUB_IP     ?= 127.0.0.1
HUB_PORT   ?= 8000
INSTRUCTOR ?= instructor
# make hub-learners LEARNERS=30 (learner01 ...) or LEARNERS=names.csv; the sheet of one-time
# passwords is also written to SHEET (root only; make hub-offboard deletes it with the last account)
LEARNERS   ?= 10
SHEET      ?= $(HUB_ROOT)/state/learners-sheet-$(shell date +%Y%m%d-%H%M%S).csv
# HTTPS: make hub TLS_CERT=cert.pem TLS_KEY=key.pem (make hub-tls makes a self-signed pair);
# HUB_URL: the address learners and certificate verifiers use, when it is not http(s)://HUB_IP:HUB_PORT
TLS_CERT   ?=
TLS_KEY    ?=
TLS_HOST   ?= $(shell hostname -f 2>/dev/null || hostname)
HUB_URL    ?=
# SPAWNER=slurm: each user's server is a Slurm job (docs/workshop.md, "The hub on the cluster"):
# SLURM_PARTITION (default: the cluster's), SLURM_RUNTIME (default 12:00:00), HUB_CONNECT_IP (the
# hub's address the nodes reach; HUB_IP stays the learners')
SPAWNER    ?= local
SLURM_PARTITION ?=
SLURM_RUNTIME   ?=
HUB_CONNECT_IP  ?=
HUB_ENV = MULTIGPU_HUB_ROOT=$(HUB_ROOT) MULTIGPU_HUB_IP=$(HUB_IP) MULTIGPU_HUB_PORT=$(HUB_PORT) \
          MULTIGPU_HUB_INSTRUCTORS=$(INSTRUCTOR) MULTIGPU_HUB_TLS_CERT=$(if $(TLS_CERT),$(abspath $(TLS_CERT))) \
          MULTIGPU_HUB_TLS_KEY=$(if $(TLS_KEY),$(abspath $(TLS_KEY))) \
          $(if $(HUB_URL),MULTIGPU_HUB_URL=$(HUB_URL)) MULTIGPU_SPAWNER=$(SPAWNER) \
          $(if $(SLURM_PARTITION),MULTIGPU_SLURM_PARTITION=$(SLURM_PARTITION)) $(if $(SLURM_RUNTIME),MULTIGPU_SLURM_RUNTIME=$(SLURM_RUNTIME)) \
          $(if $(HUB_CONNECT_IP),MULTIGPU_HUB_CONNECT_IP=$(HUB_CONNECT_IP)) PATH=$(HUB_PREFIX)/bin:/usr/local/bin:/usr/bin:/bin
HUB_REPORT ?= bench/hub-load

.PHONY: hub hub-deps hub-learners hub-queue hub-stop hub-check hub-tls hub-load hub-offboard hub-release test-hub

hub-deps: $(STAMP)
	MULTIGPU_HUB_PREFIX=$(HUB_PREFIX) deploy/hub/install.sh

hub: hub-deps
	$(HUB_ENV) $(HUB_PREFIX)/bin/multigpu workshop hub --instructor $(INSTRUCTOR)

# before the room arrives: what this box lacks for LEARNERS (cores, memory, cgroups, the sandbox,
# ports, disk, the signing key, HTTPS); exit 1 when something must be fixed first
hub-check:
	@test -x $(HUB_PREFIX)/bin/multigpu || { echo "no hub environment in $(HUB_PREFIX): run make hub-deps"; exit 1; }
	$(HUB_ENV) $(HUB_PREFIX)/bin/multigpu workshop check --learners $(LEARNERS)

# a self-signed certificate for a closed room: make hub-tls TLS_HOST=box.local, then make hub
# TLS_CERT=$(HUB_ROOT)/tls/hub.crt TLS_KEY=$(HUB_ROOT)/tls/hub.key HUB_IP=0.0.0.0
hub-tls: hub-deps
	$(HUB_ENV) $(HUB_PREFIX)/bin/multigpu workshop tls --cert $(HUB_ROOT)/tls/hub.crt --key $(HUB_ROOT)/tls/hub.key --host $(TLS_HOST)

hub-learners: hub-deps
	@if [ -f "$(LEARNERS)" ]; then $(HUB_ENV) $(HUB_PREFIX)/bin/multigpu workshop add-learners --csv $(LEARNERS) --sheet $(SHEET); \
	else $(HUB_ENV) $(HUB_PREFIX)/bin/multigpu workshop add-learners $(LEARNERS) --sheet $(SHEET); fi

hub-queue:
	$(HUB_ENV) $(HUB_PREFIX)/bin/multigpu workshop queue

# after the workshop (the hub leaves the proxy and the servers running across its own restarts)
hub-stop:
	$(HUB_ENV) $(HUB_PREFIX)/bin/multigpu workshop stop

# after the workshop: each learner's home, submissions, feedback, results, certificate and grades
# into $(HUB_ROOT)/archive/<date-time>/<login>.tar.gz, then the accounts are removed
hub-offboard:
	$(HUB_ENV) $(HUB_PREFIX)/bin/multigpu workshop offboard --all $(if $(REMOVE_STAFF),--remove-staff)

# an assignment released to the learners from a terminal, as the instructor (the formgrader's
# Generate and Release buttons): make hub-release ASSIGNMENT=lab-00
hub-release:
	@test -n "$(ASSIGNMENT)" || { echo "make hub-release ASSIGNMENT=lab-00 (lab-00 ... lab-05, assessment)"; exit 1; }
	$(HUB_ENV) $(HUB_PREFIX)/bin/multigpu workshop release $(ASSIGNMENT)

# the room load test (docs/workshop.md, "Measured"): LEARNERS accounts in a scratch hub log in
# within a minute, run Lab 0's check at once, submit Lab 0 twice; the hub is restarted once while
# it grades; every submission must be graded exactly once. Report: $(HUB_REPORT).md and .json
hub-load: hub-deps
	MULTIGPU_QUICK=1 PATH=$(HUB_PREFIX)/bin:/usr/local/bin:/usr/bin:/bin \
	$(HUB_PREFIX)/bin/multigpu workshop load --learners $(LEARNERS) --restart-hub --report $(HUB_REPORT) $(if $(NO_GRADING),--no-grading)

# the tests that run a hub (root; make hub-deps first; .ci/run runs them as root): the attacks of a
# hostile learner first (tests/test_workshop_attacks.py, their count printed), then a hub with
# learners, its restart and isolation; the operator's culler, spawn queue, memory limit and a small
# room load test; the browser test over HTTPS (its official grading on the quick profile: no
# certificate; MULTIGPU_WORKSHOP_PROFILE=cpu grades for one); ngshare behind a hub
HUB_TESTS = tests/test_workshop_hub.py tests/test_workshop_room.py tests/test_workshop_browser.py tests/test_workshop_k8s.py
HUB_TEST_ENV = MULTIGPU_QUICK=1 MULTIGPU_TEST_HUB=1 MULTIGPU_HUB_PREFIX=$(HUB_PREFIX) \
               MULTIGPU_WORKSHOP_PROFILE=$(or $(MULTIGPU_WORKSHOP_PROFILE),quick)
test-hub: $(STAMP)
	@status=0; \
	$(HUB_TEST_ENV) $(PY) -m pytest tests/test_workshop_attacks.py -v --durations=5 --junitxml=.hub-attacks.xml || status=$$?; \
	$(PY) -c "import xml.etree.ElementTree as E; t = E.parse('.hub-attacks.xml').getroot(); t = t.find('testsuite') if t.tag == 'testsuites' else t; \
	    print(f\"== hub attack tests: {t.get('tests')} run, {int(t.get('failures')) + int(t.get('errors'))} failed, {t.get('skipped')} skipped\")"; \
	$(HUB_TEST_ENV) $(PY) -m pytest $(HUB_TESTS) -v --durations=10 || status=$$?; \
	exit $$status

# ---------------------------------------------------------------------------------- Slurm cluster
# Issue 51: cluster-deps installs Slurm 22.05 and munge from the distribution, as root (idempotent:
# apt-get installs nothing twice; the lock timeout waits out another apt-get, CI's hub stage, instead
# of failing). test-cluster runs the course's jobs (multigpu.running.slurm) on a real 2-node test
# cluster that tests/slurm_cluster.py brings up in network namespaces and removes (root; -m cluster;
# make test leaves these out), the grading service's Slurm backend with its faults
# (tests/test_cluster_grading.py) and the hub with SPAWNER=slurm (tests/test_cluster_hub.py, after make hub-deps).
.PHONY: cluster-deps test-cluster
cluster-deps:
	@command -v apt-get >/dev/null || { echo "cluster-deps: no apt-get on this box; install slurmctld, slurmd, slurm-client and munge by hand"; exit 1; }
	@test "$$(id -u)" = 0 || { echo "cluster-deps: run as root (it calls apt-get install)"; exit 1; }
	apt-get install -y -o DPkg::Lock::Timeout=600 slurmctld slurmd slurm-client munge
	@for b in sbatch srun squeue sacct scancel slurmctld slurmd munged; do command -v $$b >/dev/null || { echo "cluster-deps: $$b missing after install"; exit 1; }; done
	@echo "cluster-deps: $$(dpkg-query -W -f 'slurmctld $${Version}, munge ' slurmctld)$$(dpkg-query -W -f '$${Version}' munge) installed"

test-cluster: $(STAMP)
	@test "$$(id -u)" = 0 || { echo "test-cluster: run as root (network namespaces, slurmd), after make cluster-deps"; exit 1; }
	@began=$$(date +%s); status=0; \
	MULTIGPU_QUICK=1 MULTIGPU_HUB_PREFIX=$(HUB_PREFIX) $(PY) -m pytest -m cluster tests/test_cluster.py tests/test_cluster_grading.py tests/test_cluster_hub.py -v -rs --durations=10 || status=$$?; \
	echo "== cluster tests took $$(( $$(date +%s) - began )) s"; exit $$status
