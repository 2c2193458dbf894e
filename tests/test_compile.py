"""Every kernel the families precompile builds for sm_90a, with no stack frame, no local memory and,
for matrix kernels, the tensor-core instructions they are written for."""

import pytest

from deep_kernels import gemm
from deep_kernels.__main__ import FAMILIES, _family_specs
from deep_kernels.jit import cache
from deep_kernels.jit.precompile import precompile
from deep_kernels.testing import sass

# SASS mnemonics a kernel must contain, by kernel name (matrix kernels on the tensor cores).
REQUIRED_INSTRUCTIONS = {"sm90_fp8_gemm": ("QGMMA",)}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    import os

    previous = os.environ.get("DK_JIT_CACHE_DIR")
    os.environ["DK_JIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    try:
        specs = _family_specs(FAMILIES) + gemm.compile_coverage_specs()
        entries = precompile(specs, arch="90a", progress=False)
        yield list(zip(specs, entries))
    finally:
        if previous is None:
            del os.environ["DK_JIT_CACHE_DIR"]
        else:
            os.environ["DK_JIT_CACHE_DIR"] = previous


def test_every_family_has_kernels(compiled):
    names = {spec.name for spec, _ in compiled}
    assert {"smxx_per_token_cast", "smxx_per_token_cast_back", "sm90_fp8_gemm"} <= names


def test_no_stack_frame_or_local_memory(compiled):
    for spec, entry in compiled:
        cubin = entry / cache.BINARY_NAME
        usage = sass.resource_usage(cubin)
        assert usage.stack_bytes == 0 and usage.local_bytes == 0, (spec, usage)
        text = sass.sass(cubin)
        assert ".target\tsm_90a" in text, spec
        assert sass.local_memory_instructions(text) == [], spec
        for mnemonic in REQUIRED_INSTRUCTIONS.get(spec.name, ()):
            assert mnemonic in text, (spec, mnemonic)
