"""The README's code runs as written: every ```python block, pasted into a fresh interpreter namespace, runs on
a Hopper GPU (and compiles everywhere)."""

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_python_blocks():
    assert BLOCKS


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_compiles(index):
    compile(BLOCKS[index], f"README.md python block {index}", "exec")


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs(index):
    namespace = {}
    exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), namespace)
    torch.cuda.synchronize()
    if index == 0:  # the quick start: its GEMM is the product of the inputs it quantized
        from deep_kernels.testing import calc_diff

        expected = namespace["x"].double() @ namespace["w"].double().T
        # FP8 quantization of both operands: 6.8e-4 for normal inputs of these sizes (reference casts, CPU).
        assert calc_diff(namespace["d"], expected) < 1e-3
