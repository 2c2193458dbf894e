"""Expert parallelism (deep_kernels/nn/expert_parallel.py, expert_parallel_autograd.py): outputs, and in training
the x and expert-weight gradients, bitwise equal to the single-GPU layer's over the ranks' tokens concatenated in
rank order (the router weight's gradient: the ranks' shares sum to it); the single-GPU layer's output within the
MoE layer's bounds of its float64 reference (so that a bug the two layers share shows too).

On the CPU: two processes over gloo, every kernel replaced by its plain-torch reference (which take the same
arguments), so what is tested is the exchange: which tokens go where, in what order, and how the rows come back.
On two GPUs: nn.MoE with and without a process group over NCCL (skipped with fewer GPUs). Also on the CPU: how the
expert_parallel benchmark collects its ranks' reports (a failed or silent rank stops it at once). The CPU tests spawn
processes and take a minute; the GPU runner leaves them out (host_only): its one-rank NCCL test runs the same
exchanges on the device's torch.
"""

import os
import time
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deep_kernels.nn import expert_parallel
from deep_kernels.nn.expert_parallel import expert_parallel_forward
from deep_kernels.nn.moe_autograd import moe_layer
from deep_kernels.nn.routed_experts import moe_forward
from deep_kernels.reference.moe import topk_gate as reference_topk_gate
from deep_kernels.reference.nn.moe import router_logits
from deep_kernels.reference.quant import fp8 as reference_fp8
from deep_kernels.testing import calc_diff
from deep_kernels.testing.moe_layer import (
    assert_layer_close, module_reference, moe_layer_tokens, moe_layer_weights, reference_expert_kernels,
    training_kernels_on_references,
)

REFERENCES = reference_expert_kernels()

WORLD = 2
HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 256, 128, 8, 3
# (k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor) without the bias, added per run.
GATE = (TOP_K, "sigmoid", 4, 2, True, 2.5)
# (mode, tokens of each rank, max_tokens)
CASES = (
    ("contiguous", (7, 13), None),
    ("contiguous", (0, 9), None),
    ("contiguous", (1, 12), None),
    ("masked", (5, 5), None),  # a capacity of 12 rows: W * T = 10 rounded up
    ("masked", (8, 8), 3),
)


def _quantized_experts(weight: torch.Tensor) -> tuple:
    pairs = [reference_fp8.per_block_cast_to_fp8(w) for w in weight]
    return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])


def _problem(seed: int, num_tokens: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn((num_tokens, HIDDEN), generator=g)).bfloat16()
    router = (torch.randn((EXPERTS, HIDDEN), generator=g) / HIDDEN ** 0.5).bfloat16()
    bias = torch.randn((EXPERTS,), generator=g) * 0.1
    gate_up = _quantized_experts(torch.randn((EXPERTS, 2 * INTERMEDIATE, HIDDEN), generator=g) / HIDDEN ** 0.5)
    down = _quantized_experts(torch.randn((EXPERTS, HIDDEN, INTERMEDIATE), generator=g) / INTERMEDIATE ** 0.5)
    gate = GATE[:2] + (bias,) + GATE[2:]
    return dict(x=x, logits=router_logits(x, router), gate=gate, gate_up=gate_up, down=down)


def _local(experts: tuple, rank: int) -> tuple:
    num_local = EXPERTS // WORLD
    return tuple(t[rank * num_local:(rank + 1) * num_local] for t in experts)


def _rank_cases(rank: int, store: str, failures) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        if expert_parallel.exchanging_group(dist.group.WORLD) is not dist.group.WORLD:
            failures.append(f"rank {rank}: a group of {WORLD} ranks taken as no group")
        for seed, (mode, tokens, max_tokens) in enumerate(CASES):
            p = _problem(seed, sum(tokens))
            single = moe_forward(REFERENCES, p["x"], p["logits"], p["gate"], (p["gate_up"], p["down"]), mode,
                                 max_tokens)
            first = sum(tokens[:rank])
            rows = slice(first, first + tokens[rank])
            # The other rank's experts: a planted bug the check must see. Contiguous, also: 2 and 3 chunks (a rank
            # of one token has empty ones), and the default's chunks at one row an expert on average (a rule every rank
            # must apply alike, or the exchanges hang); the real default's one chunk in the runs before.
            runs = [(owner, None, expert_parallel.OVERLAP_MIN_ROWS_PER_EXPERT) for owner in (rank, 1 - rank)]
            if mode == "contiguous":
                runs += [(rank, 2, None), (rank, 3, None), (rank, None, 1)]
            for owner, chunks, min_rows in runs:
                experts = (_local(p["gate_up"], owner), _local(p["down"], owner))
                with mock.patch.object(expert_parallel, "OVERLAP_MIN_ROWS_PER_EXPERT", min_rows):
                    out = expert_parallel_forward(p["x"][rows], p["logits"][rows], p["gate"], experts, mode,
                                                  max_tokens, None, REFERENCES, chunks)
                equal = out.shape == single[rows].shape and torch.equal(out, single[rows])
                if equal != (owner == rank) and not (owner != rank and tokens[rank] == 0):
                    failures.append(f"rank {rank}, {mode} {tokens} max_tokens={max_tokens}, chunks={chunks} from "
                                    f"{min_rows} rows, experts of rank {owner}: {'equal' if equal else 'different'}")
            if mode == "contiguous":  # chunks from the ranks' token count, not this rank's
                _, indices = REFERENCES.topk_gate(p["logits"][rows], *p["gate"])
                for min_tokens, expected in ((sum(tokens), 2), (sum(tokens) + 1, 1)):
                    routes = expert_parallel.chunked_routes(indices, WORLD, EXPERTS // WORLD, None, 2, min_tokens)
                    if len(routes) != expected:
                        failures.append(f"rank {rank}, {tokens}: {len(routes)} chunks from {min_tokens} tokens")
    finally:
        dist.destroy_process_group()


def _run(cases, rank: int, store: str, queue) -> None:
    failures = []
    try:
        cases(rank, store, failures)
    except Exception as error:  # reported through the queue: a spawned process's traceback is not the test's
        failures.append(f"rank {rank}: {type(error).__name__}: {error}")
    queue.put(failures)


def _in_processes(cases, tmp_path) -> None:
    """cases(rank, store, failures) in WORLD spawned processes, each adding what it found wrong to failures."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_run, args=(cases, rank, str(tmp_path / "store"), queue))
                 for rank in range(WORLD)]
    for p in processes:
        p.start()
    failures = [f for _ in processes for f in queue.get(timeout=900)]
    for p in processes:
        p.join(timeout=60)
    assert not failures, "\n".join(failures)
    assert all(p.exitcode == 0 for p in processes)


@pytest.mark.host_only
def test_expert_parallel_matches_single_gpu_layer_gloo(tmp_path):
    _in_processes(_rank_cases, tmp_path)


def _rank_module_cases(rank: int, store: str, failures) -> None:
    import deep_kernels.nn as dk_nn

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        config = dict(top_k=TOP_K, num_groups=4, topk_groups=2, process_group=dist.group.WORLD)
        module = dk_nn.MoE(HIDDEN, INTERMEDIATE, EXPERTS, **config, device="meta")
        shapes = {name: tuple(getattr(module, name).shape) for name in ("gate_up_weight", "gate_up_scales",
                                                                          "down_weight", "down_scales")}
        if any(shape[0] != EXPERTS // WORLD for shape in shapes.values()) or module.first_expert != rank * 4:
            failures.append(f"rank {rank}: expert buffers {shapes}, first expert {module.first_expert}")
        # from_float keeps this rank's experts of the E given: its checks reach the device (these are CPU tensors).
        weights = moe_layer_weights(HIDDEN, INTERMEDIATE, EXPERTS, "cpu")
        try:
            dk_nn.MoE.from_float(**weights, **config)
            failures.append(f"rank {rank}: from_float took CPU weights")
        except ValueError as error:
            if "must be a CUDA tensor" not in str(error):
                failures.append(f"rank {rank}: from_float: {error}")
        p = _problem(0, 4)
        try:  # every expert on every rank: refused
            expert_parallel_forward(p["x"], p["logits"], p["gate"], (p["gate_up"], p["down"]), "contiguous", None,
                                    None, REFERENCES)
            failures.append(f"rank {rank}: every expert on every rank was taken")
        except ValueError as error:
            if "E / W experts" not in str(error):
                failures.append(f"rank {rank}: {error}")
        try:  # the training layer alike
            moe_layer(p["x"], weights["router_weight"], weights["correction_bias"], weights["gate_up_weight"],
                      weights["down_weight"], **TRAINING_GATE, process_group=dist.group.WORLD)
            failures.append(f"rank {rank}: moe_layer took every expert on every rank")
        except ValueError as error:
            if "E / W experts" not in str(error):
                failures.append(f"rank {rank}: moe_layer: {error}")
    finally:
        dist.destroy_process_group()


@pytest.mark.host_only
def test_module_holds_its_ranks_experts_gloo(tmp_path):
    _in_processes(_rank_module_cases, tmp_path)


# ---- training (CPU, gloo, references) ----

TRAINING_GATE = dict(top_k=TOP_K, num_groups=4, topk_groups=2, scoring="sigmoid", renormalize=True,
                     routed_scaling_factor=2.5)
# (tokens of each rank, experts of rank 1 preferred): with the bias every slot goes to rank 1 and rank 0 receives no
# token.
TRAINING_CASES = (((7, 13), False), ((0, 9), False), ((12, 12), False), ((5, 11), True))
LEAVES = ("x", "router_weight", "gate_up_weight", "down_weight")


def _layer_gradients(x, upstream, weights: dict, experts: slice, group=None, gate: dict = TRAINING_GATE) -> tuple:
    """(moe_layer's output, {leaf: gradient}) with the experts weights[...][experts] as master weights."""
    leaves = {"x": x.detach().requires_grad_(), "router_weight": weights["router_weight"].detach().requires_grad_()}
    for name in LEAVES[2:]:
        leaves[name] = weights[name][experts].detach().requires_grad_()
    out = moe_layer(leaves["x"], leaves["router_weight"], weights["correction_bias"], leaves["gate_up_weight"],
                    leaves["down_weight"], **gate, process_group=group)
    return out.detach(), dict(zip(LEAVES, torch.autograd.grad(out, list(leaves.values()), upstream)))


def _rank_training_cases(rank: int, store: str, failures) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    patch = pytest.MonkeyPatch()
    training_kernels_on_references(patch)
    num_local = EXPERTS // WORLD
    try:
        for seed, (tokens, biased) in enumerate(TRAINING_CASES):
            weights = moe_layer_weights(HIDDEN, INTERMEDIATE, EXPERTS, "cpu", seed)
            if biased:
                weights["correction_bias"][num_local:] += 100.0
            # FP32: the ranks' shares of its gradient sum without a bf16 rounding each.
            weights["router_weight"] = weights["router_weight"].float()
            x = moe_layer_tokens(sum(tokens), HIDDEN, "cpu", seed + 10)
            upstream = moe_layer_tokens(sum(tokens), HIDDEN, "cpu", seed + 20)
            single_out, single = _layer_gradients(x, upstream, weights, slice(None))
            if biased:
                logits = router_logits(x, weights["router_weight"])
                _, indices = reference_topk_gate(logits, TOP_K, "sigmoid", weights["correction_bias"], 4, 2)
                if (indices < num_local).any():
                    failures.append(f"tokens {tokens}: the bias left slots on rank 0, which it should starve")
            rows = slice(sum(tokens[:rank]), sum(tokens[:rank + 1]))
            mine = slice(rank * num_local, (rank + 1) * num_local)
            for owner in (rank, 1 - rank):  # the other rank's experts: a planted bug the checks must see
                out, grads = _layer_gradients(x[rows], upstream[rows], weights, slice(owner * num_local,
                                                                                      (owner + 1) * num_local),
                                              dist.group.WORLD)
                router = grads["router_weight"].clone()
                dist.all_reduce(router, group=dist.group.WORLD)
                equal = {"out": torch.equal(out, single_out[rows]), "x": torch.equal(grads["x"], single["x"][rows]),
                         "router_weight": calc_diff(router, single["router_weight"]) < 1e-12}
                for name in LEAVES[2:]:
                    equal[name] = torch.equal(grads[name], single[name][mine])
                differing = [name for name, same in equal.items() if not same]
                if owner == rank and differing:
                    failures.append(f"rank {rank}, tokens {tokens}: differs in {differing}")
                if owner != rank and tokens[rank] > 0 and not differing:
                    failures.append(f"rank {rank}, tokens {tokens}: the other rank's experts gave the same results")
            for name in LEAVES:
                if not single[name].abs().sum() > 0:
                    failures.append(f"tokens {tokens}: the single-GPU gradient of {name} is zero: nothing tested")
    finally:
        patch.undo()
        dist.destroy_process_group()


@pytest.mark.host_only
def test_expert_parallel_training_matches_single_gpu_layer_gloo(tmp_path):
    _in_processes(_rank_training_cases, tmp_path)


# ---- two GPUs, and one (NCCL) ----

def _gpu_layers(g: torch.Generator) -> tuple:
    """(the single-GPU nn.MoE, the expert-parallel one over the default group) of the same random weights."""
    import deep_kernels.nn as dk_nn

    num_experts, hidden, intermediate = 32, 1024, 256
    weights = dict(router_weight=torch.randn((num_experts, hidden), device="cuda", generator=g) / 32,
                   correction_bias=torch.randn((num_experts,), device="cuda", generator=g) * 0.1,
                   gate_up_weight=torch.randn((num_experts, 2 * intermediate, hidden), device="cuda", generator=g) / 32,
                   down_weight=torch.randn((num_experts, hidden, intermediate), device="cuda", generator=g) / 16)
    config = dict(top_k=8, num_groups=8, topk_groups=4)
    return (dk_nn.MoE.from_float(**weights, **config),
            dk_nn.MoE.from_float(**weights, **config, process_group=dist.group.WORLD))


def _rank_nccl_cases(rank: int, store: str, failures) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        single, parallel = _gpu_layers(g)
        hidden = single.hidden_size
        for mode, tokens in (("contiguous", (96, 160)), ("masked", (64, 64))):
            x = torch.randn((sum(tokens), hidden), device="cuda", generator=g).bfloat16()
            rows = slice(sum(tokens[:rank]), sum(tokens[:rank + 1]))
            with torch.no_grad():
                whole = single(x, mode=mode)
                assert_layer_close(whole, module_reference(single, x, mode))
                expected = whole[rows]
                mine = x[rows].contiguous()
                outs = {"module": parallel(mine, mode=mode)}
                if mode == "contiguous":  # the overlapped exchanges across the GPUs
                    outs["2 chunks"] = expert_parallel_forward(
                        mine, parallel.router_logits(mine), parallel.gate_config(), parallel.experts(), mode, None,
                        dist.group.WORLD, chunks=2)
            for name, out in outs.items():
                if not torch.equal(out, expected):
                    failures.append(f"rank {rank} {mode} {name}: max difference "
                                    f"{(out.float() - expected.float()).abs().max()}")
        failures += _nccl_training_differences(rank, single)
    finally:
        dist.destroy_process_group()


def _module_gate(module) -> dict:
    """moe_layer's gate arguments of an nn.MoE built with the defaults but for these."""
    return dict(top_k=module.top_k, num_groups=module.num_groups, topk_groups=module.topk_groups)


def _nccl_training_differences(rank: int, single) -> list:
    """moe_layer with master weights over the two ranks against the single-GPU moe_layer on every token: the
    leaves whose gradients (and the outputs) differ."""
    tokens = (96, 160)
    weights = moe_layer_weights(single.hidden_size, single.intermediate_size, single.num_experts, "cuda", seed=4)
    x = moe_layer_tokens(sum(tokens), single.hidden_size, "cuda", seed=5)
    upstream = moe_layer_tokens(sum(tokens), single.hidden_size, "cuda", seed=6)
    gate = _module_gate(single)
    num_local = single.num_experts // WORLD
    rows, mine = slice(sum(tokens[:rank]), sum(tokens[:rank + 1])), slice(rank * num_local, (rank + 1) * num_local)
    single_out, single_grads = _layer_gradients(x, upstream, weights, slice(None), gate=gate)
    out, grads = _layer_gradients(x[rows], upstream[rows], weights, mine, dist.group.WORLD, gate)
    expected = {"out": single_out[rows], "x": single_grads["x"][rows]}
    expected.update({name: single_grads[name][mine] for name in LEAVES[2:]})
    actual = {"out": out, **grads}
    differences = [f"rank {rank} training: {name}" for name in expected
                   if not torch.equal(actual[name], expected[name])]
    router = grads["router_weight"].float()
    dist.all_reduce(router)
    # The shares are bf16 each: their sum is the whole within a few bf16 roundings.
    if calc_diff(router, single_grads["router_weight"]) > 1e-4:
        differences.append(f"rank {rank} training: router_weight")
    return differences


@pytest.mark.multi_gpu
def test_expert_parallel_module_matches_single_gpu_nccl(tmp_path):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on shared machines
    _in_processes(_rank_nccl_cases, tmp_path)


def test_a_group_of_one_rank_exchanges_nothing(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    assert expert_parallel.exchanging_group(None) is None
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert expert_parallel.exchanging_group(dist.group.WORLD) is None
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_expert_parallel_module_one_rank_matches_module(tmp_path):
    """One rank over NCCL: every step on the GPU kernels, the exchanges (copies to itself) forced; unforced, the
    module and moe_layer run the single-GPU layer without one."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        single, parallel = _gpu_layers(g)
        x = torch.randn((96, single.hidden_size), device="cuda", generator=g).bfloat16()
        weights = moe_layer_weights(single.hidden_size, single.intermediate_size, single.num_experts, "cuda", seed=4)
        with mock.patch.object(dist, "all_to_all_single", side_effect=AssertionError("an exchange on one rank")):
            for mode in ("contiguous", "masked"):
                with torch.no_grad():
                    assert torch.equal(parallel(x, mode=mode), single(x, mode=mode)), mode
            (single_out, _), (out, _) = (_layer_gradients(x, x, weights, slice(None), group, _module_gate(single))
                                         for group in (None, dist.group.WORLD))
            assert torch.equal(out, single_out)
        with mock.patch("deep_kernels.nn.moe.exchanging_group", lambda group: group), \
                mock.patch("deep_kernels.nn.moe_autograd.exchanging_group", lambda group: group), \
                mock.patch.object(dist, "all_to_all_single", wraps=dist.all_to_all_single) as exchange:
            _one_rank_exchanges_match(g, single, parallel, weights)
        assert exchange.call_count > 0
    finally:
        dist.destroy_process_group()


def _one_rank_exchanges_match(g, single, parallel, weights) -> None:
    """The one-rank test's cases through the exchanges: the module's modes, chunks, a CUDA graph and training."""
    hidden = single.hidden_size
    for mode, max_tokens in (("contiguous", None), ("masked", None), ("masked", 5)):
        single.max_tokens = parallel.max_tokens = max_tokens
        x = torch.randn((96, hidden), device="cuda", generator=g).bfloat16()
        with torch.no_grad():
            expected, out = single(x, mode=mode), parallel(x, mode=mode)
            assert_layer_close(expected, module_reference(single, x, mode))
        assert torch.equal(out, expected), f"{mode} max_tokens={max_tokens}"
    # The contiguous mode's chunks: each chunk's exchanges overlap another's experts, the same bits.
    with torch.no_grad():
        for chunks in (2, 3):
            out = expert_parallel_forward(x, parallel.router_logits(x), parallel.gate_config(), parallel.experts(),
                                          "contiguous", None, dist.group.WORLD, chunks=chunks)
            assert torch.equal(out, single(x, mode="contiguous")), f"{chunks} chunks"
    # The masked mode in a CUDA graph: captured once, replayed with new tokens.
    parallel.max_tokens = single.max_tokens = None
    static_x = torch.randn((64, hidden), device="cuda", generator=g).bfloat16()
    with torch.no_grad():
        parallel(static_x, mode="masked")  # warm: kernels compiled, the communicator made
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = parallel(static_x, mode="masked")
        for _ in range(2):
            static_x.copy_(torch.randn((64, hidden), device="cuda", generator=g).bfloat16())
            static_out.fill_(float("nan"))
            graph.replay()
            expected = single(static_x, mode="masked")
            assert_layer_close(expected, module_reference(single, static_x, "masked"))
            assert torch.equal(static_out, expected)
    # Training: the module differentiable in x, and moe_layer with master weights, through the exchanges.
    x = torch.randn((96, hidden), device="cuda", generator=g).bfloat16()
    upstream = torch.randn((96, hidden), device="cuda", generator=g).bfloat16()
    grads = [torch.autograd.grad(layer(x.requires_grad_()), x, upstream)[0] for layer in (single, parallel)]
    assert grads[0].abs().max() > 0 and torch.equal(grads[1], grads[0])
    (single_out, single_grads), (out, grads) = (
        _layer_gradients(x, upstream, weights, slice(None), group, _module_gate(single))
        for group in (None, dist.group.WORLD))
    assert torch.equal(out, single_out), "out"
    for name in LEAVES:
        assert torch.equal(grads[name], single_grads[name]), name


# ---- the expert_parallel benchmark's rank reports (CPU) ----

def test_chunking_threshold_is_the_documented_one():
    # The README and the module docstring: DeepSeek-V3 (256 experts, top 8) moves tokens in two chunks from 16384
    # over the ranks; the one-GPU suite times that many on its one rank.
    from deep_kernels.benchmarks import expert_parallel as suite
    assert expert_parallel.OVERLAP_CHUNKS == 2 and expert_parallel.overlap_min_tokens(256, 8) == 16384
    assert suite.ONE_GPU_CASES[0] == (16384, "contiguous", "eager")


def _report_rows(rank: int, queue) -> None:
    queue.put([{"rank": rank}] if rank == 0 else [])


def _report_error_or_hang(rank: int, queue) -> None:
    if rank == 0:
        time.sleep(600)  # as a rank waiting in a collective for a failed peer
    queue.put("rank 1: OutOfMemoryError: planted")


def _exit_without_report(rank: int, queue) -> None:
    if rank == 0:
        time.sleep(600)
    os._exit(3)


@pytest.mark.host_only
@pytest.mark.parametrize("target,match", [
    (_report_rows, None), (_report_error_or_hang, "OutOfMemoryError: planted"),
    (_exit_without_report, "rank 1 exited with code 3 without a report"),
])
def test_benchmark_ranks_report_or_fail_at_once(target, match):
    from deep_kernels.benchmarks import expert_parallel as suite

    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=target, args=(rank, queue)) for rank in range(WORLD)]
    for p in processes:
        p.start()
    start = time.monotonic()
    try:
        with mock.patch.object(suite, "RANK_TIMEOUT_S", 20):  # a missed failure then says "no report"
            if match is None:  # in the order the ranks report
                assert sorted(suite._rank_results(processes, queue), key=len) == [[], [{"rank": 0}]]
            else:
                with pytest.raises(RuntimeError, match=match):
                    suite._rank_results(processes, queue)
    finally:
        for p in processes:
            p.kill()
            p.join()
    assert time.monotonic() - start < 20
