"""Time forced FP8 GEMM configs against the model's pick and cuBLAS blockwise, all in turns in one process.

Usage (on the GPU machine):
    python scripts/ab_fp8_gemm_configs.py --m 4096 --config block_m=256,block_n=96,pipelined=1,multicast=2 ...
    python scripts/ab_fp8_gemm_configs.py ... --compile-only   # build the kernels (parallel) and stop
    ncu --kernel-name regex:sm90_fp8_gemm ... python scripts/ab_fp8_gemm_configs.py ... --no-timing   # one call each
    python scripts/ab_fp8_gemm_configs.py ... --soak-s 0.8   # also SM clock and power per config (nvidia-smi)

Each --config is a DK_FP8_GEMM_CONFIG text applied over the pick (gemm.apply_config_override); a 2-CTA multicast
whose operand's block count is odd for the shape moves to the other operand, or is dropped. Every output is checked
against float64 (poisoned first); a config above --max-diff fails the run. Prints per shape the pick's time, each
config's time and its speed-up over the pick, and cuBLAS's time with each one's speed-up over it.

--soak-s S: after the timing in turns, each config (and cuBLAS) runs back to back for S seconds (no flush) while
nvidia-smi samples the SM clock and the power every 100 ms; prints per config the mean clock and power after the
soak's first SOAK_WARMUP_S, the sustained time per call and the energy per call (power x time).
"""

import argparse
import datetime
import json
import subprocess
import time

import torch

from deep_kernels import gemm
from deep_kernels.device import get_num_sms
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.jit.precompile import precompile
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import calc_diff
from deep_kernels.testing.bench import L2Flusher, time_kernels_us
from deep_kernels.testing.gemm import make_gemm_inputs

NKS = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))


def _legal_multicast(fields: dict, pick, m: int, n: int) -> dict:
    """fields (over the pick's) with a 2-CTA multicast moved to the operand whose block count is even (or dropped)."""
    fields = dict(fields)
    if fields.get("multicast", pick.num_tma_multicast) != 2:
        return fields
    n_even = -(-n // fields.get("block_n", pick.block_n)) % 2 == 0
    m_even = -(-m // fields.get("block_m", pick.block_m)) % 2 == 0
    on_a = bool(fields.get("multicast_on_a", pick.multicast_on_a))
    fields["multicast"] = 2
    if (on_a and n_even) or (not on_a and m_even):
        return fields
    if on_a and m_even:
        fields["multicast_on_a"] = 0
    elif not on_a and n_even:
        fields["multicast_on_a"] = 1
    else:
        fields["multicast"] = 1
    return fields


def configs_for(m: int, n: int, k: int, texts, num_sms: int) -> list:
    """The pick, then each --config over it (duplicates of an earlier config dropped)."""
    pick = heuristics.get_fp8_gemm_config(m, n, k, num_sms, allow_split_k=True)
    configs = [pick]
    for text in texts:
        if ":" in text:
            shape, text = text.split(":", 1)
            if shape != f"{n}x{k}":
                continue
        fields = _legal_multicast(gemm.parse_config_override(text), pick, m, n)
        config = gemm.apply_config_override(pick, fields, 2, k)
        if config not in configs:
            configs.append(config)
    return configs


def _cublas(a, b):
    (a, sfa), (b, sfb) = a, b
    sfa_column_major = sfa.contiguous().t().contiguous().t()
    return lambda: torch._scaled_mm(a, b.t(), scale_a=sfa_column_major, scale_b=sfb.t(), out_dtype=torch.bfloat16)


SMI_FIELDS = ("timestamp", "clocks.sm", "power.draw.instant", "power.draw", "clocks_event_reasons.active")
SMI_TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"


def start_smi_log(path: str):
    """nvidia-smi sampling SMI_FIELDS every 100 ms into path (the fields it knows: older drivers lack some)."""
    fields = [f for f in SMI_FIELDS
              if subprocess.run(["nvidia-smi", f"--query-gpu={f}", "--format=csv,noheader"],
                                capture_output=True).returncode == 0]
    log = open(path, "w")
    log.write(",".join(fields) + "\n")
    log.flush()
    process = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                                "-lms", "100"], stdout=log)
    return process, fields


def read_smi_log(path: str, fields: list) -> list:
    """[(datetime, {field: float or str})] of the samples logged so far."""
    samples = []
    with open(path) as f:
        for line in f.read().splitlines()[1:]:
            values = [v.strip() for v in line.split(",")]
            if len(values) != len(fields):
                continue
            try:
                when = datetime.datetime.strptime(values[0], SMI_TIME_FORMAT)
            except ValueError:
                continue
            row = {}
            for field, value in zip(fields[1:], values[1:]):
                try:
                    row[field] = float(value)
                except ValueError:
                    row[field] = value
            samples.append((when, row))
    return samples


SOAK_WARMUP_S = 0.15


def soak(fn, seconds: float) -> tuple:
    """Runs fn back to back for about `seconds`; (start, end datetimes after the first SOAK_WARMUP_S, us per call
    there)."""
    calls = 0
    begin = time.perf_counter()
    while time.perf_counter() - begin < min(SOAK_WARMUP_S, seconds / 2):
        for _ in range(8):
            fn()
        torch.cuda.synchronize()
    half_start, half_begin = datetime.datetime.now(), time.perf_counter()
    while time.perf_counter() - begin < seconds:
        for _ in range(8):
            fn()
        calls += 8
    torch.cuda.synchronize()
    half_end = datetime.datetime.now()
    return half_start, half_end, (time.perf_counter() - half_begin) / calls * 1e6


def soak_report(label: str, window: tuple, samples: list, flops: int) -> dict:
    """Mean clock and power of the samples inside the soak's measured part, with its time and energy per call."""
    start, end, us = window
    inside = [row for when, row in samples if start <= when <= end]
    power_field = "power.draw.instant" if inside and isinstance(inside[0].get("power.draw.instant"), float) else \
        "power.draw"
    clocks = [row["clocks.sm"] for row in inside if isinstance(row.get("clocks.sm"), float)]
    powers = [row[power_field] for row in inside if isinstance(row.get(power_field), float)]
    reasons = sorted({row.get("clocks_event_reasons.active") for row in inside} - {None})
    clock = sum(clocks) / len(clocks) if clocks else float("nan")
    power = sum(powers) / len(powers) if powers else float("nan")
    report = {"label": label, "soak_us": round(us, 2), "soak_tflops": round(flops / us / 1e6, 1),
              "clock_mhz": round(clock), "power_w": round(power, 1), "samples": len(inside),
              "mj_per_call": round(power * us / 1e3, 3), "tflops_per_kw": round(flops / us / 1e6 / power * 1e3, 1),
              "reasons": reasons}
    print(f"  soak {label:>16} {us:8.2f} us/call {report['soak_tflops']:7.1f} TFLOPS clock {clock:6.0f} MHz "
          f"power {power:6.1f} W ({len(inside)} samples) {report['mj_per_call']:.3f} mJ/call "
          f"{report['tflops_per_kw']:.1f} TFLOPS/kW reasons {reasons}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", type=int, nargs="+", default=[4096])
    parser.add_argument("--nk", nargs="+", default=[f"{n}x{k}" for n, k in NKS], help="N x K shapes, e.g. 32768x512")
    parser.add_argument("--config", nargs="*", default=[], help="DK_FP8_GEMM_CONFIG texts to time against the pick (NxK:text: that shape only)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--no-timing", action="store_true", help="run and check each config once (for a profiler)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--max-diff", type=float, default=1e-5)
    parser.add_argument("--soak-s", type=float, default=0.0, help="seconds of back-to-back runs per config for "
                        "clock and power (0: none)")
    parser.add_argument("--smi-log", default="smi.csv", help="where nvidia-smi's samples go with --soak-s")
    parser.add_argument("--soak-nk", nargs="*", default=[], help="soak these N x K shapes only (default: all)")
    parser.add_argument("--soak-reverse", action="store_true", help="soak in order, then again in reverse order")
    args = parser.parse_args()
    num_sms = get_num_sms()
    nks = [tuple(int(v) for v in nk.split("x")) for nk in args.nk]
    problems = [(m, n, k, configs_for(m, n, k, args.config, num_sms)) for m in args.m for n, k in nks]
    precompile([gemm.kernel_spec(config, n, k, torch.bfloat16, False)
                for _, n, k, configs in problems for config in configs])
    if args.compile_only:
        return

    flusher = L2Flusher(torch.cuda.get_device_properties(0).L2_cache_size)
    smi = start_smi_log(args.smi_log) if args.soak_s > 0 else None
    rows, wrong = [], []
    for m, n, k, configs in problems:
        a, b = make_gemm_inputs(m, n, k)
        outputs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in configs]
        calls = [gemm.forced_config_call(config, a, b, d) for config, d in zip(configs, outputs)]
        expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
        diffs = []
        for call, d in zip(calls, outputs):
            d.fill_(float("nan"))
            call()
            diffs.append(calc_diff(d, expected))
        del expected
        if args.no_timing:
            for config, diff in zip(configs, diffs):
                print(f"{m}x{n}x{k} {heuristics.config_label(config):>14} {config.num_stages}st diff {diff:.1e}")
                if not diff <= args.max_diff:
                    wrong.append({"m": m, "n": n, "k": k, "label": heuristics.config_label(config), "calc_diff": diff})
            continue
        peers = [_cublas(a, b)]
        try:
            peers[0]()
        except RuntimeError as error:
            print(f"cuBLAS blockwise failed for {m}x{n}x{k}: {error}")
            peers = []
        times = time_kernels_us(calls + peers, flusher, reps=args.reps)
        cublas_us = times[-1] if peers else float("nan")
        pick_us = times[0]
        for config, us, diff in zip(configs, times, diffs):
            row = {"m": m, "n": n, "k": k, "label": heuristics.config_label(config), "stages": config.num_stages,
                   "us": round(us, 2), "tflops": round(2 * m * n * k / us / 1e6, 1),
                   "vs_pick": round(pick_us / us, 3), "vs_cublas": round(cublas_us / us, 3), "calc_diff": diff}
            rows.append(row)
            if not diff <= args.max_diff:
                wrong.append(row)
            print(f"{m}x{n}x{k} {row['label']:>14} {config.num_stages}st {us:8.2f} us {row['tflops']:7.1f} TFLOPS "
                  f"vs pick {row['vs_pick']:.3f} vs cuBLAS {row['vs_cublas']:.3f} diff {diff:.1e}")
        print(f"{m}x{n}x{k} cuBLAS {cublas_us:.2f} us")
        if smi and (not args.soak_nk or f"{n}x{k}" in args.soak_nk):
            labels = [heuristics.config_label(config) for config in configs] + (["cuBLAS"] if peers else [])
            # NOTE: in order, then in reverse, so that the drift of the power state falls on every config alike.
            order = list(range(len(labels)))
            order += order[::-1] if args.soak_reverse else []
            windows = [(i, soak((calls + peers)[i], args.soak_s)) for i in order]
            time.sleep(0.25)
            samples = read_smi_log(args.smi_log, smi[1])
            for i, window in windows:
                report = soak_report(labels[i], window, samples, 2 * m * n * k)
                for row in rows:
                    if (row["m"], row["n"], row["k"], row["label"]) == (m, n, k, labels[i]):
                        row.setdefault("soaks", []).append(report)
    if smi:
        smi[0].terminate()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    for row in wrong:
        print(f"WRONG: {row}")
    if wrong:
        raise SystemExit(f"{len(wrong)} configs above calc_diff {args.max_diff}")


if __name__ == "__main__":
    main()
