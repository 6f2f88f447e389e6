#!/usr/bin/env bash
# `make gpu-check` on a GPU machine that has Python, PyTorch with CUDA and nvcc but reaches no
# package index (a lent GPU server, a cluster node): run from the checkout, with .gpucheck/ made
# beforehand by tools/gpu_check_bundle.sh on a machine that reaches one.
#
#   tools/gpu_check_device.sh [gpu-check arguments]       (PYTHON=... to choose the interpreter)
#
# 1. installs the bundle's wheels into that Python (no index: only .gpucheck/wheels);
# 2. builds Horovod from the bundle's source with the project's patch (tools/install_horovod.sh):
#    with NCCL where nvcc is present (NCCL from the nvidia-nccl package beside torch), and if
#    that build fails, with its CPU operations only (Horovod then all-reduces CUDA tensors
#    through host memory): the report's horovod line says which;
# 3. runs `multigpu gpu-check` from src/ (the image's torch, not the course's pin) and copies the
#    report to $OUT when that is set.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(command -v "${PYTHON:-python3}")
bundle=$PWD/.gpucheck/wheels
[ -d "$bundle" ] || { echo "no $bundle: run tools/gpu_check_bundle.sh where a package index is reachable" >&2; exit 1; }
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$bundle PIP_DISABLE_PIP_VERSION_CHECK=1
"$py" -m pip install -q papermill ipykernel nbformat nbclient ipywidgets mpich
"$py" -m ipykernel install --sys-prefix --name python3 >/dev/null
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}

read -r site cc < <("$py" -c '
import sysconfig, torch
cc = "".join(map(str, torch.cuda.get_device_capability(0))) if torch.cuda.is_available() else ""
print(sysconfig.get_paths()["purelib"], cc)')
nccl=$site/nvidia/nccl
if [ -d "$nccl/lib" ] && [ ! -e "$nccl/lib/libnccl.so" ]; then
  ln -s "$(ls "$nccl"/lib/libnccl.so.* | head -n 1)" "$nccl/lib/libnccl.so"  # the linker asks for libnccl.so
fi
export HOROVOD_NCCL_INCLUDE=$nccl/include HOROVOD_NCCL_LIB=$nccl/lib
[ -n "$cc" ] && export HOROVOD_BUILD_CUDA_CC_LIST=$cc  # this GPU's architecture only: a shorter build
start=$(date +%s)
if ! tools/install_horovod.sh "$py"; then
  echo "[gpu-check] Horovod with NCCL did not build: building it with its CPU operations" >&2
  MULTIGPU_HOROVOD_FLAVOUR=cpu tools/install_horovod.sh "$py"
fi
echo "[gpu-check] Horovod ready in $(( $(date +%s) - start )) s"

status=0
# the report is saved after each check: under $OUT (which the device tool brings back, also from a
# run cut off by its time limit) when that is set
"$py" -m multigpu.cli gpu-check ${OUT:+--report "$OUT/gpu-check"} "$@" || status=$?
if [ -n "${OUT:-}" ]; then  # files at most 2 folders down come back
  if ls src/multigpu/figures/reference_runs/gpu/*.json >/dev/null 2>&1; then
    mkdir -p "$OUT/reference_gpu" && cp src/multigpu/figures/reference_runs/gpu/*.json "$OUT/reference_gpu/"
  fi
fi
exit $status
