import os

import pytest
import torch

FULL = os.environ.get("DK_FULL_TEST", "") not in ("", "0")


def _has_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def pytest_collection_modifyitems(config, items):
    if _has_hopper():
        return
    skip = pytest.mark.skip(reason="needs a Hopper GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty kernel cache for the test."""
    monkeypatch.setenv("DK_JIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"
