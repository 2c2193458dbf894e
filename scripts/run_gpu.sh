#!/usr/bin/env bash
# The GPU runner: in one call on an H200, install the wheels carried in .whl/, run the test suite (all but
# the CPU-only compile check) and the benchmarks, write logs and benchmark results (results.tar:
# <gpu>/<suite>.json and .png) under $OUT, and print a short table, then the counts last.
# Usage (device): DK_COMMIT=<sha> [DK_GPU_TESTS="tests/test_x.py ..."] [DK_TEST_SHARD=i/n]
#                 [DK_PRECOMPILE_FAMILIES="moe ..."]
#                 [DK_RUN_BENCH=0] bash scripts/run_gpu.sh [bench suites...]
# (DK_RUN_BENCH=0: the tests alone, no benchmarks. DK_GPU_TESTS takes pytest arguments: with the pytest_xdist and
# execnet wheels in .whl/, DK_GPU_TESTS="tests -n 8 --dist loadfile" runs the test files in 8 processes.)
# Exits non-zero when the precompile, any test or the benchmarks fail. The tests run with DK_REQUIRE_GPU=1, so
# a GPU test that is skipped (no usable GPU, or a test skipping itself) fails; tests without the gpu marker
# may still skip (CPU-only checks), and the last line counts them apart.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/deep_kernels_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

source scripts/gpu_env.sh || exit 1
python3 -m deep_kernels info
# Every family's specializations in parallel first, so that the tests' first calls mostly hit the cache
# (DK_PRECOMPILE_FAMILIES: only these, space-separated, for a run that tests and times some families).
start=$(date +%s)
families=()
for family in ${DK_PRECOMPILE_FAMILIES-}; do families+=(--family "$family"); done
python3 -m deep_kernels precompile "${families[@]}" 2>&1 | tail -n 1
precompile_status=${PIPESTATUS[0]}
echo "precompile took $(( $(date +%s) - start )) s (exit status $precompile_status)"
# DK_GPU_TESTS: the test paths to run (default: all of tests/; empty: none, to split a session's work
# over two calls of the 10-minute limit).
test_paths=${DK_GPU_TESTS-tests}
test_status=0
test_counts="tests not run (DK_GPU_TESTS is empty)"
if [ -n "$test_paths" ]; then
    start=$(date +%s)
    # (test_compile.py, which builds every kernel without a GPU, runs in the full mode only, and the host_only tests,
    # CPU plumbing, are left out: CI runs both.)
    # A test still running after 300 s (a kernel that hangs: its CUDA context cannot be recovered in the process)
    # gets every thread's traceback in the log, so that the run says which test hung before the call's time ends.
    # The log ($OUT/pytest.log) names every test with its outcome (-v), so that a run stopped by the call's time
    # limit still says which tests ran.
    # Every GEMM output check's errors go to $OUT/gemm_errors.jsonl (tests/conftest.py), summed up below.
    rm -f "$OUT/gemm_errors.jsonl"
    # shellcheck disable=SC2086
    DK_GEMM_ERRORS_OUT="$OUT/gemm_errors.jsonl" DK_REQUIRE_GPU=1 python3 -m pytest $test_paths -v -rs -m "not host_only" --maxfail=30 -o faulthandler_timeout=300 \
        -p no:cacheprovider --junitxml="$OUT/pytest.xml" 2>&1 | tee "$OUT/pytest.log" | tail -n 25
    test_status=${PIPESTATUS[0]}
    echo "tests took $(( $(date +%s) - start )) s (pytest exit status $test_status)"
    # The worst calc_diff of the GEMM checks within their bound, per output dtype, beside the bound they were held
    # to; the checks beyond it (planted bugs that a test expects the check to catch) are counted apart.
    python3 - "$OUT/gemm_errors.jsonl" <<'PY'
import json
import sys
try:
    records = [json.loads(line) for line in open(sys.argv[1])]
except OSError:
    records = []
regions = ("whole", "tile", "row")
for dtype in sorted({r["dtype"] for r in records}):
    mine = [r for r in records if r["dtype"] == dtype]
    within = [r for r in mine if all(r[region] < r["bound"] for region in regions)]
    bounds = sorted({r["bound"] for r in mine})
    worst = {region: max(within, key=lambda r: r[region]) for region in regions} if within else {}
    print(f"GEMM errors, {dtype} D, {len(within)} checks within bounds {bounds} ({len(mine) - len(within)} beyond, "
          "caught on purpose or failed): " + "; ".join(f"{region} {r[region]:.3g} ({r['test']})"
                                                     for region, r in worst.items()))
PY
    # Seconds per test file from pytest's JUnit report, the slowest first (how to split the suite over calls).
    python3 - "$OUT/pytest.xml" <<'PY'
import collections
import sys
import xml.etree.ElementTree as ElementTree
try:
    root = ElementTree.parse(sys.argv[1]).getroot()
except (OSError, ElementTree.ParseError):
    sys.exit()
seconds = collections.Counter()
for case in root.iter("testcase"):
    seconds[case.get("classname", "").split(".")[-1] or "?"] += float(case.get("time", 0))
print("seconds per test file: " + ", ".join(f"{name} {time:.0f}" for name, time in seconds.most_common()))
PY
    # The counts from pytest's JUnit report (skips left there are of tests without the gpu marker).
    test_counts=$(python3 - "$OUT/pytest.xml" <<'PY'
import sys
import xml.etree.ElementTree as ElementTree
try:
    root = ElementTree.parse(sys.argv[1]).getroot()
except (OSError, ElementTree.ParseError) as error:
    print(f"tests: no report ({error})")
    sys.exit()
count = {key: sum(int(suite.get(key, 0)) for suite in root.iter("testsuite"))
         for key in ("tests", "failures", "errors", "skipped")}
passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
print(f"tests: {passed} passed, {count['failures']} failed, {count['errors']} errors, "
      f"{count['skipped']} skipped (CPU-only; a skipped GPU test counts as failed)")
PY
)
fi

# The last line: PASS only when every part that ran exited 0; then the test counts and each part's status.
finish() {
    local status=0 part
    for part in "$precompile_status" "$test_status" "$1"; do
        if [ "$part" != 0 ] && [ "$part" != "not run" ]; then status=1; fi
    done
    echo "RESULT $([ "$status" -eq 0 ] && echo PASS || echo FAIL): $test_counts; precompile exit" \
         "$precompile_status, pytest exit $test_status, bench exit $1"
    exit "$status"
}
if [ "${DK_RUN_BENCH:-1}" = 0 ]; then
    echo
    finish "not run"
fi

suites=()
for suite in "$@"; do suites+=(--suite "$suite"); done
results=$(mktemp -d)
# SM clock and power through the benchmarks (100 ms samples: a rough view of the clock under load).
nvidia-smi --query-gpu=clocks.sm,power.draw,power.limit --format=csv,noheader,nounits -lms 100 >"$OUT/clocks.csv" 2>/dev/null &
clock_sampler=$!
python3 -m deep_kernels bench --out "$results" --commit "${DK_COMMIT:-unknown}" "${suites[@]}" 2>&1 | tee "$OUT/bench.log" | grep -v "^wrote"
bench_status=${PIPESTATUS[0]}
kill "$clock_sampler" 2>/dev/null
python3 - "$OUT/clocks.csv" <<'PY'
import statistics, sys
samples = [[float(v) for v in line.split(",")] for line in open(sys.argv[1]) if line.count(",") == 2]
if samples:
    peak = max(power for _, power, _ in samples)
    loaded = [clock for clock, power, _ in samples if power >= 0.8 * peak]
    print(f"SM clock in the 100 ms samples within 80% of the peak power ({peak:.0f} W of {samples[0][2]:.0f} W): "
          f"median {statistics.median(loaded):.0f} MHz, min {min(loaded):.0f} MHz ({len(loaded)} of {len(samples)})")
PY
# One archive: the device tool returns at most 8 files.
tar -C "$results" -cf "$OUT/results.tar" .
echo
if [ -f "$OUT/pytest.log" ]; then echo "pytest: $(tail -n 1 "$OUT/pytest.log")"; fi
finish "$bench_status"
