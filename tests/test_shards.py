"""DK_TEST_SHARD (tests/conftest.py): n runs of shards i/n run every collected test once, whole files to a shard."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import shard_files

TESTS = Path(__file__).resolve().parent


def test_shards_deal_every_file_once_and_about_evenly():
    weights = {f"test_{name}.py": weight for name, weight in zip("abcdefgh", (50, 40, 30, 20, 10, 10, 5, 1))}
    shards = [shard_files(weights, index, 3) for index in range(3)]
    assert sorted(f for shard in shards for f in shard) == sorted(weights)
    totals = [sum(weights[f] for f in shard) for shard in shards]
    assert totals == [60, 55, 51]  # heaviest first, each to the lightest shard
    assert shards == [shard_files(dict(reversed(weights.items())), index, 3) for index in range(3)]
    assert shard_files(weights, 0, 1) == set(weights)


def _collected(shard: str) -> list:
    env = dict(os.environ, DK_TEST_SHARD=shard)
    files = [str(TESTS / "test_shards.py"), str(TESTS / "test_cli.py"), str(TESTS / "test_tuning.py")]
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                            capture_output=True, text=True, env=env, cwd=TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


@pytest.mark.host_only
def test_shard_runs_partition_the_collection():
    everything = _collected("0/1")
    halves = [_collected(f"{index}/2") for index in range(2)]
    assert sorted(halves[0] + halves[1]) == sorted(everything) and all(halves)
    files = [{test.split("::")[0] for test in half} for half in halves]
    assert not files[0] & files[1]  # whole files to a shard
