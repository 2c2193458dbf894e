#!/usr/bin/env bash
# Sets up a source checkout: the package (editable) with its pinned dependencies, the CUTLASS headers
# linked into third_party/, and a check that nvcc is there. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

# torch comes with the package, from the tested range pyproject.toml pins (a torch outside it is replaced).
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "torch not found: installing it with the package (if its CUDA build does not suit your driver, install"
    echo "a build that does, in the range pyproject.toml gives, and run this again)"
fi
"$PYTHON" -m pip install -e ".[test,bench]"

# CUTLASS/CuTe headers come from the pinned nvidia-cutlass wheel; DK_CUTLASS_INCLUDE may point elsewhere.
cutlass_source=$("$PYTHON" -c "import importlib.util as u, os; print(os.path.join(u.find_spec('cutlass_library').submodule_search_locations[0], 'source'))")
if [ ! -d "$cutlass_source/include/cute" ]; then
    echo "error: the nvidia-cutlass wheel has no headers at $cutlass_source/include" >&2
    exit 1
fi
mkdir -p third_party
ln -sfn "$cutlass_source" third_party/cutlass
echo "CUTLASS headers: third_party/cutlass -> $cutlass_source"

if nvcc_line=$("$PYTHON" -c "from deep_kernels.jit import compiler; p = compiler.nvcc_path(); print(p, '-', compiler.nvcc_version(p))" 2>&1); then
    echo "nvcc: $nvcc_line"
else
    echo "error: $nvcc_line" >&2
    exit 1
fi
echo "deep_kernels installed. Try: python -m deep_kernels info"
