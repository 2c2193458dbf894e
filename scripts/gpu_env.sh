# Sourced by GPU-machine commands (run_gpu.sh, one-off experiment runs) from the repository root: installs the
# wheels carried in .whl/, puts the package and CUTLASS on the paths and picks the host compiler.
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# NOTE: the image's $CXX wrapper has built extensions that crash at their first call.
export DK_JIT_HOST_CXX=/usr/bin/g++

cutlass_source=$(python3 -c "import importlib.util as u, os; print(os.path.join(u.find_spec('cutlass_library').submodule_search_locations[0], 'source'))") || return 1
mkdir -p third_party && ln -sfn "$cutlass_source" third_party/cutlass
