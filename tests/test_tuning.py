"""Measured tuning's store (CPU): winners are found again by problem, ignored once the kernel source or
compiler changes (the op's identity), and the model ranks the candidates the tuner times."""

import json

import pytest

from deep_kernels import gemm, tuning
from deep_kernels.heuristics import fp8_gemm as heuristics


def test_record_then_lookup(tmp_path):
    path = tmp_path / "tuned" / "nvidia-h200.json"
    key = tuning.problem_key(4096, 7168, 2048, 2, False, 132)
    fields = heuristics.config_fields(heuristics.make_config(256, 128, 2, True, 2))
    assert tuning.lookup(path, "fp8_gemm_nt", "id-1", key) is None
    tuning.record(path, "fp8_gemm_nt", "id-1", key, fields, us=97.5, model_us=99.0)
    assert tuning.lookup(path, "fp8_gemm_nt", "id-1", key) == fields
    assert heuristics.make_config(out_dtype_bytes=2, **fields) == heuristics.make_config(256, 128, 2, True, 2)
    # Other problems, ops and SM counts miss.
    assert tuning.lookup(path, "fp8_gemm_nt", "id-1", tuning.problem_key(4096, 7168, 2048, 2, False, 66)) is None
    assert tuning.lookup(path, "other_op", "id-1", key) is None


def test_a_new_identity_makes_old_winners_stale(tmp_path):
    path = tmp_path / "nvidia-h200.json"
    key = tuning.problem_key(64, 2112, 7168, 2, False, 132)
    other = tuning.problem_key(128, 2112, 7168, 2, False, 132)
    tuning.record(path, "fp8_gemm_nt", "old", key, {"block_m": 64}, us=10.0, model_us=11.0)
    assert tuning.lookup(path, "fp8_gemm_nt", "new", key) is None
    # Recording under the new identity starts a fresh table: the old winner is gone.
    tuning.record(path, "fp8_gemm_nt", "new", other, {"block_m": 128}, us=12.0, model_us=12.0)
    assert tuning.lookup(path, "fp8_gemm_nt", "new", key) is None
    assert tuning.lookup(path, "fp8_gemm_nt", "new", other) == {"block_m": 128}
    assert [(op, k, current) for op, k, _, current in tuning.entries(path, {"fp8_gemm_nt": "new"})] == [
        ("fp8_gemm_nt", other, True)]
    assert [current for *_, current in tuning.entries(path, {"fp8_gemm_nt": "newer"})] == [False]


def test_lookup_sees_a_rewritten_file(tmp_path):
    path = tmp_path / "nvidia-h200.json"
    key = tuning.problem_key(64, 2112, 7168, 2, False, 132)
    tuning.record(path, "fp8_gemm_nt", "id", key, {"block_m": 64}, us=10.0, model_us=11.0)
    assert tuning.lookup(path, "fp8_gemm_nt", "id", key) == {"block_m": 64}
    data = json.loads(path.read_text())
    data["ops"]["fp8_gemm_nt"]["configs"][key]["config"] = {"block_m": 128}
    tuning.write(path, data)
    assert tuning.lookup(path, "fp8_gemm_nt", "id", key) == {"block_m": 128}


def test_a_foreign_file_is_refused(tmp_path):
    path = tmp_path / "nvidia-h200.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a deep_kernels tuning file"):
        tuning.read(path)


def test_identity_follows_the_kernel_source():
    identity = tuning.source_identity(heuristics.KERNEL_HEADER, "90a")
    assert identity == tuning.source_identity(heuristics.KERNEL_HEADER, "90a")
    assert identity != tuning.source_identity("kernels/smxx_per_token_cast.cuh", "90a")


def test_gpu_slug():
    assert tuning.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert tuning.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


@pytest.mark.parametrize("m,n,k", [(64, 2112, 7168), (4096, 4096, 7168), (4001, 576, 592)])
def test_ranked_configs_start_with_the_pick(m, n, k):
    ranked = heuristics.ranked_configs(m, n, k, 132, allow_split_k=True)
    assert ranked[0][1] == heuristics.get_fp8_gemm_config(m, n, k, 132, allow_split_k=True)
    times = [seconds for seconds, _ in ranked]
    assert times == sorted(times)
    assert len({config for _, config in ranked}) == len(ranked)


def test_stored_fields_make_the_same_config():
    for m, n, k in ((64, 2112, 7168), (4096, 4096, 7168), (128, 7168, 16384)):
        for _, config in heuristics.ranked_configs(m, n, k, 132, allow_split_k=True)[:8]:
            assert heuristics.make_config(out_dtype_bytes=2, **heuristics.config_fields(config)) == config


def test_tuned_config_is_consulted_before_the_model(monkeypatch):
    tuned = heuristics.make_config(128, 96, 1, False, 2)
    monkeypatch.setattr(gemm, "_tuned_config", lambda *args: tuned)
    monkeypatch.setattr(gemm, "_config_override", lambda: None)
    assert gemm._choose_config(4096, 4096, 7168, 132, 2, False) == tuned
    # DK_FP8_GEMM_CONFIG still overrides on top.
    monkeypatch.setattr(gemm, "_config_override", lambda: {"block_n": 64})
    assert gemm._choose_config(4096, 4096, 7168, 132, 2, False).block_n == 64


@pytest.mark.parametrize("gemm_type,m,g", [("m_grouped_contiguous", 32768, 4), ("m_grouped_masked", 76, 16)])
def test_ranked_grouped_configs_start_with_the_pick(gemm_type, m, g):
    from deep_kernels.heuristics import grouped_fp8_gemm

    ranked = grouped_fp8_gemm.ranked_grouped_configs(gemm_type, m, 4096, 7168, g, 132)
    assert ranked[0][1] == grouped_fp8_gemm.get_grouped_fp8_gemm_config(gemm_type, m, 4096, 7168, g, 132)
    assert [seconds for seconds, _ in ranked] == sorted(seconds for seconds, _ in ranked)
    assert all(config.num_splits == 1 and config.block_m <= 128 for _, config in ranked)


def test_grouped_tuned_config_is_consulted_before_the_model(monkeypatch, tmp_path):
    from deep_kernels import grouped_gemm

    monkeypatch.setenv("DK_JIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(grouped_gemm, "has_gpu", lambda: True)
    monkeypatch.setattr(grouped_gemm.torch.cuda, "get_device_name", lambda *args: "NVIDIA H200")
    monkeypatch.setattr(grouped_gemm, "target_arch", lambda: "90a")
    identity = tuning.source_identity(heuristics.KERNEL_HEADER, "90a")
    tuned = heuristics.make_config(128, 96, 1, False, 2)
    path = tuning.tuning_file("NVIDIA H200")
    key = tuning.grouped_problem_key(16, 76, 4096, 7168, 132)
    assert grouped_gemm._tuned_config("m_grouped_masked", 76, 4096, 7168, 16, 132) is None
    tuning.record(path, "m_grouped_fp8_gemm_nt_masked", identity, key, heuristics.config_fields(tuned), 10.0, 11.0)
    assert grouped_gemm._tuned_config("m_grouped_masked", 76, 4096, 7168, 16, 132) == tuned
    # Another kind, group count or SM count misses.
    assert grouped_gemm._tuned_config("m_grouped_contiguous", 76, 4096, 7168, 16, 132) is None
    assert grouped_gemm._tuned_config("m_grouped_masked", 76, 4096, 7168, 8, 132) is None
    assert grouped_gemm._tuned_config("m_grouped_masked", 76, 4096, 7168, 16, 66) is None


def test_the_check_sees_one_wrong_tile_and_unwritten_elements():
    import torch

    from deep_kernels import tune
    from deep_kernels.testing import calc_diff

    generator = torch.Generator().manual_seed(0)
    expected = torch.randn((1024, 2048), generator=generator, dtype=torch.float64)
    actual = expected.to(torch.bfloat16)
    assert tune.output_error(actual, expected) <= tune.MAX_CALC_DIFF
    wrong_tile = actual.clone()
    wrong_tile[128:256, 1024:1152] *= 1.03
    # The whole output's calc_diff does not see it; its tile's does.
    assert calc_diff(wrong_tile, expected) <= tune.MAX_CALC_DIFF < tune.output_error(wrong_tile, expected)
    unwritten = actual.clone()
    unwritten[5, 7] = float("nan")
    assert not tune.output_error(unwritten, expected) <= tune.MAX_CALC_DIFF


@pytest.mark.gpu
def test_tune_refuses_a_candidate_wrong_in_one_tile(monkeypatch, tmp_path):
    from deep_kernels import tune

    monkeypatch.setenv("DK_JIT_CACHE_DIR", str(tmp_path))
    forced = gemm.forced_config_call

    def one_wrong_tile(config, a, b, d, *args, **kwargs):
        call = forced(config, a, b, d, *args, **kwargs)

        def run():
            call()
            d[:128, :128] *= 1.03

        return run

    monkeypatch.setattr(gemm, "forced_config_call", one_wrong_tile)
    with pytest.raises(RuntimeError, match="gave calc_diff"):
        tune.tune_fp8_gemm([(4096, 2112, 7168)], count=1, log=lambda line: None)


@pytest.mark.gpu
def test_tune_stores_checked_winners_that_calls_then_use(monkeypatch, tmp_path):
    import torch

    from deep_kernels import grouped_gemm, tune

    monkeypatch.setenv("DK_JIT_CACHE_DIR", str(tmp_path))
    grouped_gemm._plans.clear()
    dense = tune.tune_fp8_gemm([(128, 2112, 7168)], count=2, log=lambda line: None)
    grouped = tune.tune_grouped_gemm([("masked", 4, 64, 2112, 7168), ("contiguous", 2, 256, 2112, 512)], count=2,
                                     log=lambda line: None)
    path = tuning.tuning_file(torch.cuda.get_device_name())
    stored = {(op, key): entry["config"] for op, key, entry, _ in tuning.entries(path, {})}
    assert len(dense) == 1 and len(grouped) == 2 and len(stored) == 3
    num_sms = grouped_gemm.get_num_sms()
    masked_key = ("m_grouped_fp8_gemm_nt_masked", tuning.grouped_problem_key(4, int(1.2 * 64), 2112, 7168, num_sms))
    assert stored[masked_key] == grouped[0][1]
    # The grouped call of that problem plans with the stored winner.
    _, config, _ = grouped_gemm._plan(grouped_gemm.MASKED, int(1.2 * 64), 2112, 7168, 4)
    assert heuristics.config_fields(config) == grouped[0][1]
    grouped_gemm._plans.clear()
