"""The on-disk kernel cache: keys, directories, atomic publication and verified reads.

An entry is a directory `<cache>/<kernel name>/<key>/` holding the binary and its SHA-256. The key
hashes everything that decides the binary (generated source, the contents of every header it
includes, compiler identity and flags, target architecture), so an edited header never serves a stale
binary. Entries are built in a temporary directory and renamed into place, under a per-key file lock,
so concurrent processes build a kernel once and never see a partial entry; an entry whose binary does
not match its checksum is rebuilt, never loaded.
"""

import hashlib
import re
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

from deep_kernels import envs

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT = PACKAGE_ROOT.parent
CSRC_ROOT = REPO_ROOT / "csrc"

BINARY_NAME = "kernel.cubin"

_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def cache_dir() -> Path:
    """DK_JIT_CACHE_DIR, else jit_cache/ of a source checkout, else ~/.cache/deep_kernels."""
    configured = envs.get("DK_JIT_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    if (REPO_ROOT / "pyproject.toml").exists() and (REPO_ROOT / "jit_cache").is_dir():
        return REPO_ROOT / "jit_cache"
    return Path.home() / ".cache" / "deep_kernels"


def included_headers(source: str, include_root: Path = CSRC_ROOT) -> list:
    """Every header under include_root that the source includes, transitively, as sorted paths.

    Quoted includes resolve against the including file's folder, then include_root; angle includes
    are system or CUTLASS headers, covered by the compiler identity in the key.
    """
    found = {}
    pending = [(source, include_root)]
    while pending:
        text, folder = pending.pop()
        for name in _QUOTED_INCLUDE.findall(text):
            for base in (folder, include_root):
                path = (base / name).resolve()
                if path.is_file():
                    break
            else:
                raise FileNotFoundError(f'header "{name}" not found under {folder} or {include_root}')
            if path not in found:
                found[path] = path.read_text()
                pending.append((found[path], path.parent))
    return sorted(found)


def cache_key(source: str, compiler_identity: str, include_root: Path = CSRC_ROOT) -> str:
    digest = hashlib.sha256()
    for part in (compiler_identity, source):
        digest.update(part.encode())
        digest.update(b"\0")
    for path in included_headers(source, include_root):
        digest.update(str(path.relative_to(include_root)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def entry_dir(kernel_name: str, key: str) -> Path:
    return cache_dir() / kernel_name / key


def read_entry(entry: Path, binary_name: str = BINARY_NAME):
    """The binary of a complete, uncorrupted entry, else None."""
    try:
        binary = (entry / binary_name).read_bytes()
        expected = (entry / (binary_name + ".sha256")).read_text().strip()
    except OSError:
        return None
    return binary if hashlib.sha256(binary).hexdigest() == expected else None


def get_or_build(entry: Path, build, binary_name: str = BINARY_NAME) -> bytes:
    """The entry's binary; on a miss or a corrupt entry, `build(tmp_dir)` makes one and it is published.

    build(tmp_dir: Path) -> bytes returns the binary and may write side files (source, PTX) into tmp_dir.
    """
    binary = read_entry(entry, binary_name)
    if binary is not None:
        return binary
    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry) + ".lock"):
        binary = read_entry(entry, binary_name)
        if binary is not None:
            return binary
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        try:
            binary = build(staging)
            (staging / binary_name).write_bytes(binary)
            (staging / (binary_name + ".sha256")).write_text(hashlib.sha256(binary).hexdigest() + "\n")
            if entry.exists():
                # A corrupt entry: move it aside first so the rename below stays atomic.
                shutil.rmtree(entry.rename(staging.with_name(staging.name + ".corrupt")))
            staging.rename(entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return binary


def cache_size_bytes() -> int:
    root = cache_dir()
    if not root.is_dir():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
