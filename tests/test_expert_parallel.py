"""Expert parallelism (deep_kernels/nn/expert_parallel.py): outputs bitwise equal to the single-GPU layer over the
ranks' tokens concatenated in rank order, and that layer's within the MoE layer's bounds of its float64 reference
(so that a bug the two layers share shows too).

On the CPU: two processes over gloo, every kernel replaced by its plain-torch reference (which take the same
arguments), so what is tested is the exchange: which tokens go where, in what order, and how the rows come back.
On two GPUs: nn.MoE with and without a process group over NCCL (skipped with fewer GPUs).
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from deep_kernels.nn.expert_parallel import expert_parallel_forward
from deep_kernels.nn.routed_experts import moe_forward
from deep_kernels.reference.nn.moe import router_logits
from deep_kernels.reference.quant import fp8 as reference_fp8
from deep_kernels.testing.moe_layer import assert_layer_close, module_reference, reference_expert_kernels

REFERENCES = reference_expert_kernels()

WORLD = 2
HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 256, 128, 8, 3
# (k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor) without the bias, added per run.
GATE = (TOP_K, "sigmoid", 4, 2, True, 2.5)
# (mode, tokens of each rank, max_tokens)
CASES = (
    ("contiguous", (7, 13), None),
    ("contiguous", (0, 9), None),
    ("masked", (6, 6), None),
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
        for seed, (mode, tokens, max_tokens) in enumerate(CASES):
            p = _problem(seed, sum(tokens))
            single = moe_forward(REFERENCES, p["x"], p["logits"], p["gate"], (p["gate_up"], p["down"]), mode,
                                 max_tokens)
            first = sum(tokens[:rank])
            rows = slice(first, first + tokens[rank])
            for owner in (rank, 1 - rank):  # the other rank's experts: a planted bug the check must see
                experts = (_local(p["gate_up"], owner), _local(p["down"], owner))
                out = expert_parallel_forward(p["x"][rows], p["logits"][rows], p["gate"], experts, mode, max_tokens,
                                              None, REFERENCES)
                equal = out.shape == single[rows].shape and torch.equal(out, single[rows])
                if equal != (owner == rank) and not (owner != rank and tokens[rank] == 0):
                    failures.append(f"rank {rank}, {mode} {tokens} max_tokens={max_tokens}, experts of rank "
                                    f"{owner}: {'equal' if equal else 'different'}")
    finally:
        dist.destroy_process_group()


def _run(rank: int, store: str, queue) -> None:
    failures = []
    try:
        _rank_cases(rank, store, failures)
    except Exception as error:  # reported through the queue: a spawned process's traceback is not the test's
        failures.append(f"rank {rank}: {type(error).__name__}: {error}")
    queue.put(failures)


def _in_processes(target, tmp_path) -> None:
    """target(rank, store, queue) in WORLD spawned processes; each puts its list of failures on the queue."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=target, args=(rank, str(tmp_path / "store"), queue)) for rank in range(WORLD)]
    for p in processes:
        p.start()
    failures = [f for _ in processes for f in queue.get(timeout=900)]
    for p in processes:
        p.join(timeout=60)
    assert not failures, "\n".join(failures)
    assert all(p.exitcode == 0 for p in processes)


def test_expert_parallel_matches_single_gpu_layer_gloo(tmp_path):
    _in_processes(_run, tmp_path)


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


def _run_nccl(rank: int, store: str, queue) -> None:
    failures = []
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=WORLD)
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
                out = parallel(x[rows].contiguous(), mode=mode)
            if not torch.equal(out, expected):
                failures.append(f"rank {rank} {mode}: max difference {(out.float() - expected.float()).abs().max()}")
        dist.destroy_process_group()
    except Exception as error:
        failures.append(f"rank {rank}: {type(error).__name__}: {error}")
    queue.put(failures)


@pytest.mark.multi_gpu
def test_expert_parallel_module_matches_single_gpu_nccl(tmp_path):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on shared machines
    _in_processes(_run_nccl, tmp_path)


@pytest.mark.gpu
def test_expert_parallel_module_one_rank_matches_module(tmp_path):
    """One rank over NCCL: every step on the GPU kernels (the exchanges are copies to itself)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        single, parallel = _gpu_layers(g)
        hidden = single.hidden_size
        for mode, max_tokens in (("contiguous", None), ("masked", None), ("masked", 5)):
            single.max_tokens = parallel.max_tokens = max_tokens
            x = torch.randn((96, hidden), device="cuda", generator=g).bfloat16()
            with torch.no_grad():
                expected, out = single(x, mode=mode), parallel(x, mode=mode)
                assert_layer_close(expected, module_reference(single, x, mode))
            assert torch.equal(out, expected), f"{mode} max_tokens={max_tokens}"
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
        with pytest.raises(ValueError, match="forward only"):
            parallel(torch.randn((4, hidden), device="cuda").bfloat16().requires_grad_())
    finally:
        dist.destroy_process_group()
