"""Measured tuning: configs timed on the user's GPU (`python -m deep_kernels tune`), stored next to the kernel
cache and consulted before the heuristics' model.

One JSON file per GPU name, `<cache dir>/tuned/<gpu>.json`:
    {"ops": {op: {"identity": ..., "configs": {problem key: {"config": {...}, "us": ..., "model_us": ...,
                                                             "date": ...}}}}}
An op's identity hashes its kernel header with every header it includes and the compiler identity, so a new
kernel source or compiler makes the stored winners of that op stale: they are ignored until tuned again.
Without a file nothing changes: untuned choices are the model's, deterministic as before.
"""

import datetime
import functools
import json
import os
import re
import tempfile
from pathlib import Path

from deep_kernels.jit import cache

TUNED_DIR = "tuned"


def gpu_slug(gpu_name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200' (the benchmark results' folder names)."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def tuning_file(gpu_name: str) -> Path:
    return cache.cache_dir() / TUNED_DIR / f"{gpu_slug(gpu_name)}.json"


def problem_key(m: int, n: int, k: int, out_dtype_bytes: int, with_accumulation: bool, num_sms: int) -> str:
    return f"{m}x{n}x{k}/out{out_dtype_bytes}{'+c' if with_accumulation else ''}/sms{num_sms}"


def grouped_problem_key(num_groups: int, m: int, n: int, k: int, num_sms: int) -> str:
    """A grouped GEMM's key: m is the total rows (contiguous) or the expected rows per group (masked)."""
    return f"{num_groups}x{m}x{n}x{k}/sms{num_sms}"


@functools.lru_cache(maxsize=None)
def source_identity(header: str, arch: str) -> str:
    """Hash of a kernel header, everything it includes and the compiler identity (what a binary depends on
    besides its template arguments)."""
    from deep_kernels.jit import compiler

    return cache.cache_key(f'#include "{header}"\n', compiler.compiler_identity(arch))


def read(path: Path) -> dict:
    """The file's contents; an empty store when it does not exist."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"ops": {}}
    if not isinstance(data, dict) or not isinstance(data.get("ops"), dict):
        raise ValueError(f"{path} is not a deep_kernels tuning file (delete it to tune again)")
    return data


def write(path: Path, data: dict) -> None:
    """Atomically: a concurrent reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(f.name, path)


def record(path: Path, op: str, identity: str, key: str, config: dict, us: float, model_us: float) -> None:
    """Store one measured winner; an op whose identity changed starts a fresh table."""
    data = read(path)
    table = data["ops"].get(op)
    if table is None or table.get("identity") != identity:
        table = data["ops"][op] = {"identity": identity, "configs": {}}
    table["configs"][key] = {"config": config, "us": round(us, 2), "model_us": round(model_us, 2),
                             "date": datetime.date.today().isoformat()}
    write(path, data)


def lookup(path: Path, op: str, identity: str, key: str):
    """The stored config fields of a problem, or None (no file, no entry, or a stale identity)."""
    table = _read_cached(path, _mtime(path)).get("ops", {}).get(op)
    if table is None or table.get("identity") != identity:
        return None
    entry = table["configs"].get(key)
    return None if entry is None else dict(entry["config"])


def _mtime(path: Path):
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


@functools.lru_cache(maxsize=8)
def _read_cached(path: Path, mtime) -> dict:
    return {"ops": {}} if mtime is None else read(path)


def entries(path: Path, identities: dict) -> list:
    """(op, key, entry, current) for every stored winner; current is False where the identity is stale."""
    data = read(path)
    return [(op, key, entry, table.get("identity") == identities.get(op))
            for op, table in sorted(data["ops"].items()) for key, entry in sorted(table["configs"].items())]
