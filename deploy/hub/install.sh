#!/usr/bin/env bash
# What `make hub` needs on a workshop box, installed once (root; `make hub-deps` runs it):
#   - Node and npm from the distribution (apt-get), configurable-http-proxy from npm (pinned);
#   - a Python environment every learner account can run, in $MULTIGPU_HUB_PREFIX
#     (default /opt/multigpu-hub): a venv of the distribution's python3.11 (the course's .venv
#     may live in a folder learners cannot enter, and its python is often a link into one),
#     with the course's pinned packages, the course itself (editable: the hub serves this
#     checkout), JupyterHub (pinned) and Horovod (tools/install_horovod.sh: the cached wheel).
# Running it again installs only what is missing.
set -euo pipefail

CHP_VERSION=5.3.0
JUPYTERHUB_VERSION=5.3.0
course=$(cd "$(dirname "$0")/../.." && pwd)
prefix=${MULTIGPU_HUB_PREFIX:-/opt/multigpu-hub}
python=${MULTIGPU_HUB_PYTHON:-/usr/bin/python3.11}

say() { printf '[hub-deps] %s\n' "$*"; }
fail() { printf '[hub-deps] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "run as root (it installs system packages and creates $prefix): sudo make hub-deps"

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

pip() { "$prefix/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }
if [ ! -x "$prefix/bin/python" ]; then
  say "creating the learners' Python environment in $prefix (from $python)"
  "$python" -m venv "$prefix"
fi
# what the environment was built from: a changed pin or Horovod patch rebuilds it
want="course=$course jupyterhub=$JUPYTERHUB_VERSION pyproject=$(sha256sum "$course/pyproject.toml" | cut -c1-12) \
horovod-patch=$(sha256sum "$course"/tools/horovod-*.patch | cut -c1-12)"
if [ "$(cat "$prefix/.hub-ready" 2>/dev/null)" != "$want" ]; then
  say "installing torch, the course ($course) and JupyterHub $JUPYTERHUB_VERSION into $prefix (minutes)"
  pip "torch==$(sed -n 's/^ *"torch==\([^"]*\)".*/\1/p' "$course/pyproject.toml")"
  pip -e "$course"
  pip "jupyterhub==$JUPYTERHUB_VERSION"
  "$course/tools/install_horovod.sh" "$prefix/bin/python"
  echo "$want" > "$prefix/.hub-ready"
fi
chmod -R a+rX "$prefix"
say "ready: $prefix ($("$prefix/bin/jupyterhub" --version)), configurable-http-proxy $(configurable-http-proxy --version)"
