"""Parallel ahead-of-time builds: many specializations compiled into the kernel cache, by ninja running
nvcc, or by a process pool running NVRTC (DK_JIT_USE_NVRTC).

Works without a GPU (the architecture comes from DK_JIT_ARCH or defaults to sm_90a). With NVRTC the
workers are spawned, so a script calling precompile() needs the `if __name__ == "__main__":` guard.
"""

import multiprocessing
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from deep_kernels import envs
from deep_kernels.device import target_arch
from deep_kernels.jit import cache, compiler

_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")


def _ninja() -> str:
    try:
        import ninja

        return os.path.join(ninja.BIN_DIR, "ninja")
    except ImportError:
        found = shutil.which("ninja")
        if found is None:
            raise RuntimeError("ninja not found: pip install ninja") from None
        return found


def precompile(specs, jobs: int = None, arch: str = None, progress: bool = True) -> list:
    """Compile every spec not yet in the cache; returns the cache entry of each spec, in order."""
    arch = arch or target_arch()
    identity = compiler.compiler_identity(arch)
    sources = [spec.render() for spec in specs]
    entries = [cache.entry_dir(spec.name, cache.cache_key(src, identity)) for spec, src in zip(specs, sources)]
    first_of_entry = {}
    for i, entry in enumerate(entries):
        if str(entry) not in first_of_entry and cache.read_entry(entry) is None:
            first_of_entry[str(entry)] = i
    missing = list(first_of_entry.values())
    if not missing:
        return entries

    build = _build_with_nvrtc if compiler.use_nvrtc() else _build_with_ninja
    with tqdm(total=len(missing), desc="precompile", unit="kernel", disable=not progress) as bar:
        binaries = build({i: sources[i] for i in missing}, arch, jobs or os.cpu_count() or 1, bar)

    for i in missing:
        def publish(staging: Path, i=i) -> bytes:
            if envs.get("DK_JIT_KEEP_SOURCE"):
                (staging / compiler.SOURCE_NAME).write_text(sources[i])
            return binaries[i]

        cache.get_or_build(entries[i], publish)
    return entries


def _build_with_ninja(sources: dict, arch: str, jobs: int, bar: tqdm) -> dict:
    """{index: cubin} of {index: source}, compiled by nvcc processes that ninja runs."""
    with tempfile.TemporaryDirectory(prefix="dk_precompile_") as workdir:
        workdir = Path(workdir)
        command = compiler.compile_command(Path("IN"), Path("OUT"), arch)
        command = " ".join("$in" if a == "IN" else "$out" if a == "OUT" else shlex.quote(a) for a in command)
        lines = [f"rule nvcc\n  command = {command}\n  description = $out\n"]
        for i, source in sources.items():
            (workdir / f"{i}.cu").write_text(source)
            lines.append(f"build {i}.cubin: nvcc {i}.cu\n")
        (workdir / "build.ninja").write_text("\n".join(lines))

        run = [_ninja(), "-C", str(workdir), "-j", str(jobs)]
        env = dict(os.environ, NINJA_STATUS="[%f/%t] ")
        with subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
            log = []
            for line in proc.stdout:
                log.append(line)
                match = _PROGRESS.match(line)
                if match:
                    bar.update(int(match.group(1)) - bar.n)
        if proc.returncode != 0:
            raise RuntimeError("precompile failed:\n" + "".join(log[-200:]))
        if envs.get("DK_JIT_PTXAS_VERBOSE"):
            # ninja passes each nvcc's output (ptxas's report) through between its progress lines.
            print("".join(line for line in log if not _PROGRESS.match(line)), file=sys.stderr, end="")
        return {i: (workdir / f"{i}.cubin").read_bytes() for i in sources}


def _build_with_nvrtc(sources: dict, arch: str, jobs: int, bar: tqdm) -> dict:
    """{index: cubin} of {index: source}, compiled by NVRTC in worker processes."""
    # Processes, as compiles in threads of one process run one at a time. Spawned: a fresh interpreter
    # inherits no CUDA context or threads from this one.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(sources)), mp_context=context) as pool:
        futures = {pool.submit(compiler.nvrtc_compile, source, arch): i for i, source in sources.items()}
        binaries = {}
        try:
            for future in as_completed(futures):
                binaries[futures[future]] = future.result().cubin
                bar.update()
        except BaseException:
            # Fail fast, as ninja does: queued compiles do not start.
            pool.shutdown(cancel_futures=True)
            raise
        return binaries
