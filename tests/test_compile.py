"""Every kernel the families precompile builds for sm_90a, with no stack frame, no local memory and,
for matrix kernels, the tensor-core instructions they are written for.

Compiling them all takes minutes, so this runs in the full mode only (`python -m deep_kernels test --full`,
DK_FULL_TEST=1), which CI runs after the default suite."""

import re

import pytest

from deep_kernels import gemm
from deep_kernels.__main__ import FAMILIES, _family_specs
from deep_kernels.jit import cache
from deep_kernels.jit.precompile import precompile
from deep_kernels.testing import sass

from conftest import cache_dir_set_to

pytestmark = pytest.mark.full


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    with cache_dir_set_to(tmp_path_factory.mktemp("cache")):
        specs = _family_specs(FAMILIES) + gemm.compile_coverage_specs()
        yield list(zip(specs, precompile(specs, arch="90a", progress=False)))


def test_every_family_has_kernels(compiled):
    names = {spec.name for spec, _ in compiled}
    assert {"smxx_per_token_cast", "smxx_per_token_cast_back", "sm90_fp8_gemm"} <= names


def _is_bf16_gemm(spec) -> bool:
    return spec.name == "sm90_fp8_gemm" and gemm.FP8_GEMM.template_arguments(spec)["kOperands"].endswith("::Bf16")


def test_no_stack_frame_or_local_memory(compiled):
    for spec, entry in compiled:
        required = ("HGMMA",) if _is_bf16_gemm(spec) else None
        assert sass.kernel_problems(spec.name, entry / cache.BINARY_NAME, required) == [], spec


def test_bf16_gemm_keeps_a_wgmma_group_in_flight(compiled):
    # The BF16 K loop waits for the previous K block's group only; ptxas would wait for every group at once if it
    # could not track them.
    bf16 = [(spec, entry) for spec, entry in compiled if _is_bf16_gemm(spec)]
    assert bf16
    for spec, entry in bf16:
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass.sass(entry / cache.BINARY_NAME), spec


def test_pipelined_gemm_keeps_a_wgmma_group_in_flight(compiled):
    # ptxas serializes wgmma (waiting for every group at once) when it cannot track the groups in flight;
    # the pipelined K loop must keep its wait for "at most one group pending".
    pipelined = [(spec, entry) for spec, entry in compiled
                 if spec.name == "sm90_fp8_gemm" and gemm.FP8_GEMM.template_arguments(spec)["kPipelined"] == "true"]
    assert pipelined
    for spec, entry in pipelined:
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass.sass(entry / cache.BINARY_NAME), spec


def test_pipelined_fp4_promotion_keeps_a_wgmma_group_in_flight(compiled):
    # The swapped FP4 kernel's pipelined promotion waits for the previous K block's group only, while the next one
    # runs.
    from deep_kernels import fp4_gemm

    pipelined = [(spec, entry) for spec, entry in compiled if spec.name == "sm90_fp8_fp4_gemm_swap_ab" and
                 fp4_gemm.FP8_FP4_SWAP_AB_GEMM.template_arguments(spec)["kPipelinedPromotion"] == "true"]
    assert pipelined
    for spec, entry in pipelined:
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass.sass(entry / cache.BINARY_NAME), spec


def test_epilogue_overlap_stores_with_a_wgmma_group_in_flight(compiled):
    # The next tile's first wgmma group is issued before the tile's store and waited for only after it: some
    # TMA store (or reduce) follows a wgmma with no wait between them (without the overlap, a wait always does).
    overlapped = [(spec, entry) for spec, entry in compiled
                  if spec.name == "sm90_fp8_gemm" and gemm.FP8_GEMM.template_arguments(spec)["kOverlapEpilogue"] == "true"]
    assert overlapped
    for spec, entry in overlapped:
        events = re.findall(r"\b(QGMMA|WARPGROUP\.DEPBAR|UTMASTG|UTMAREDG)", sass.sass(entry / cache.BINARY_NAME))
        assert any(a == "QGMMA" and b in ("UTMASTG", "UTMAREDG") for a, b in zip(events, events[1:])), spec


def turn_taking_groups(sass_text: str) -> tuple:
    """(wgmma groups run between a wait for the turn and its hand-over once they are done, QGMMA instructions) of a
    SASS text."""
    events = re.findall(r"\b(QGMMA|WARPGROUP\.DEPBAR|BAR\.SYNC|BAR\.ARV)\S*( \S+ 0x100)?", sass_text)
    tokens = " ".join(name if name in ("QGMMA", "WARPGROUP.DEPBAR") or count else "other" for name, count in events)
    return (len(re.findall(r"BAR\.SYNC (?:QGMMA )+(?:\S+ )*?WARPGROUP\.DEPBAR BAR\.ARV", tokens)),
            tokens.split().count("QGMMA"))


def test_ping_pong_takes_turns_around_each_wgmma_group(compiled):
    # Each warpgroup waits for its turn (bar.sync on a 256-thread barrier) right before its wgmma group and hands the
    # turn over (bar.arrive) right after the wait for the group: every QGMMA sits in such a turn.
    ping_pong = [(spec, entry) for spec, entry in compiled if spec.name == "sm90_fp8_gemm" and
                 gemm.FP8_GEMM.template_arguments(spec)["kMathSchedule"].endswith("::PingPong")]
    assert ping_pong
    for spec, entry in ping_pong:
        groups, num_qgmma = turn_taking_groups(sass.sass(entry / cache.BINARY_NAME))
        assert groups > 0 and groups * 4 == num_qgmma, spec


def test_own_tiles_pass_the_turn_with_the_last_group_in_flight(compiled):
    # Own tiles: the warpgroup hands the mainloop over (bar.arrive on the other's 256-thread turn barrier) right after
    # issuing its tile's last wgmma group, before waiting for it, so that its promotion tail and store overlap the
    # other warpgroup's groups; and it waits for its turn (bar.sync) before it issues any group.
    own = [(spec, entry) for spec, entry in compiled if spec.name == "sm90_fp8_gemm" and
           gemm.FP8_GEMM.template_arguments(spec)["kMathSchedule"].endswith("::OwnTilePingPong")]
    assert own
    for spec, entry in own:
        events = re.findall(r"\b(QGMMA|WARPGROUP\.DEPBAR|BAR\.SYNC|BAR\.ARV)\S*( \S+ 0x100)?",
                            sass.sass(entry / cache.BINARY_NAME))
        tokens = [name if name in ("QGMMA", "WARPGROUP.DEPBAR") or count else "other" for name, count in events]
        assert any(a == "QGMMA" and b == "BAR.ARV" and c == "WARPGROUP.DEPBAR"
                   for a, b, c in zip(tokens, tokens[1:], tokens[2:])), spec
        assert "BAR.SYNC" in tokens and tokens.index("BAR.SYNC") < tokens.index("QGMMA"), spec
