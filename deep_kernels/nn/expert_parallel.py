"""Expert parallelism of the MoE layer over torch.distributed: rank r of W holds experts [r * n, (r + 1) * n),
n = E / W, and the tokens it was given; the exchanges are torch.distributed.all_to_all_single (NCCL on GPUs).

    gate      where the tokens are: the router logits and topk_gate of the rank's own tokens
    dispatch  each token goes once to every rank that holds one of its experts, cast to FP8 (per_token_cast_to_fp8,
              1 x 128 FP32 scales: the cast the layer does anyway, half the bytes of BF16), with its k global expert
              ids, k routing weights and scales (their bits as int32, one exchange)
    experts   each rank maps the ids it received to its own (map_global_to_local_experts: another rank's expert
              becomes -1, a dropped slot), lays them out (moe_layout), expands the FP8 rows (moe_expand: the same
              rows as the layer's expand and cast) and runs the layer's expert steps (nn/routed_experts.py)
    combine   each slot's down-projected row goes back to its token's rank, which adds a token's k rows in slot
              order (moe_reduce over a layout of the received rows)
Every step treats a row on its own, and a rank receives tokens in (source rank, token) order, so the output is
bitwise that of the single-GPU layer over the ranks' tokens concatenated in rank order, the masked capacity's
first-come order included.

contiguous (prefill): one exchange of counts (tokens and slots per rank pair) sizes the buffers: the one host
    synchronization of the forward. Where each chunk still gives every expert OVERLAP_MIN_ROWS_PER_EXPERT rows on
    average (DeepSeek-V3, 256 experts of top 8: from 16384 tokens over the ranks), the tokens go in
    OVERLAP_CHUNKS consecutive chunks: every chunk's dispatch is queued at once and each chunk's combine as soon as
    its experts are done, so the communicator moves one chunk's rows while the GEMMs work on another's (with NCCL,
    all_to_all_single(async_op=True) runs on the communicator's stream). Every step treats a row on its own, so the
    output is the same bits in any number of chunks.
masked (decode): every rank must pass the same T; a rank sends a block of T rows to each rank (its tokens for
    that rank first) and gets a block of T * k slot rows back from each, so the sizes follow from T and W alone:
    no host synchronization, and the whole forward can be captured in a CUDA graph. The capacity per expert is
    max_tokens, or W * T rounded up to a multiple of 4 (none dropped; the single-GPU layer's default over W * T).
Training (the contiguous layout, differentiable): nn/expert_parallel_autograd.py, on this file's routes.
"""

from typing import NamedTuple

import torch
import torch.distributed as dist

from deep_kernels.moe.layout import MoeLayout, contiguous_max_rows
from deep_kernels.nn.routed_experts import ExpertKernels, KERNELS, masked_capacity, routed_experts
from deep_kernels.validation import ceil_div


def expert_parallel_forward(x: torch.Tensor, logits: torch.Tensor, gate_config: tuple, experts: tuple, mode: str,
                            max_tokens, group, kernels: ExpertKernels = KERNELS, chunks: int = None) -> torch.Tensor:
    """The layer's output for this rank's tokens (the module docstring).

    Args:
        x: [T, H] bf16 tokens of this rank; logits: their FP32 [T, E] router logits.
        gate_config: topk_gate's arguments after the logits (nn.MoE.gate_config).
        experts: this rank's ((gate_up_weight, gate_up_scales), (down_weight, down_scales)), n experts each.
        mode: "contiguous" or "masked"; max_tokens: the masked capacity per expert (None: W * T
            rounded up to a multiple of 4).
        group: the torch.distributed process group of the W ranks.
        kernels: the functions the steps call (the package's kernels).
        chunks: the contiguous mode's token chunks, the same on every rank (None: OVERLAP_CHUNKS where each gives
            every expert OVERLAP_MIN_ROWS_PER_EXPERT rows on average, else one).

    Returns:
        [T, H] bf16.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    num_local = experts[0][0].shape[0]
    check_local_experts(logits.shape[1], num_local, group)
    weights, indices = kernels.topk_gate(logits, *gate_config)
    if mode == "masked":
        return _masked_exchange(x, weights, indices, world, rank, num_local, experts, max_tokens, group, kernels)
    if chunks is None:
        routes = chunked_routes(indices, world, num_local, group, OVERLAP_CHUNKS,
                                overlap_min_tokens(logits.shape[1], indices.shape[1]))
    else:
        routes = chunked_routes(indices, world, num_local, group, chunks)
    return _contiguous_exchange(x, weights, indices, rank, num_local, experts, routes, group, kernels)


def exchanging_group(group):
    """The group whose ranks exchange tokens: None for no group, and for a group of one rank, which holds every
    expert: the single-GPU layer gives it the same bits without the exchanges' copies to itself."""
    return None if group is None or dist.get_world_size(group) == 1 else group


def check_local_experts(num_experts: int, num_local: int, group) -> None:
    """A rank's experts are its share of the E the router scores: E / W each."""
    world = dist.get_world_size(group)
    if num_local * world != num_experts:
        raise ValueError(f"each of the {world} ranks holds E / W experts: {num_experts} / {world}, got {num_local} "
                         f"on this rank")


def _token_ranks(indices: torch.Tensor, world: int, num_local: int) -> tuple:
    """(rank of each slot [T, k] int64, bool [T, W]: whether token t has a slot on rank r)."""
    slot_rank = indices.long() // num_local
    hit = torch.zeros((indices.shape[0], world), dtype=torch.bool, device=indices.device)
    return slot_rank, hit.scatter_(1, slot_rank, True)


def _first_true(flags: torch.Tensor, count: int) -> torch.Tensor:
    """int64 positions of the first `count` true entries of a flat bool tensor, ascending (no host sync)."""
    return torch.argsort((~flags).to(torch.uint8), stable=True)[:count]


def _scatter_index(values: torch.Tensor, valid: torch.Tensor, size: int) -> torch.Tensor:
    """int64 [size]: out[values[i]] = i where valid (values distinct there), -1 elsewhere (no host sync)."""
    out = torch.full((size + 1,), -1, dtype=torch.int64, device=values.device)
    target = torch.where(valid, values.long(), size)
    out.scatter_(0, target, torch.arange(values.numel(), device=values.device))
    return out[:size]


def routing_metadata(indices: torch.Tensor, weights: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
    """int32 [T, 2k + ...]: the k expert ids, the k FP32 weights' bits and the bits of more 4-byte columns (the FP8
    tokens' scales), for one exchange."""
    return torch.cat([indices.to(torch.int32), weights.view(torch.int32), *(t.view(torch.int32) for t in more)], dim=1)


def received_routing(metadata: torch.Tensor, k: int) -> tuple:
    """(ids int32 [R, k], weights FP32 [R, k], the rest's int32 columns) of received routing_metadata rows."""
    ids, weights, rest = metadata[:, :k], metadata[:, k:2 * k], metadata[:, 2 * k:]
    return ids.contiguous(), weights.contiguous().view(torch.float32), rest


def _received(codes: torch.Tensor, metadata: torch.Tensor, k: int) -> tuple:
    """(ids [R, k], weights [R, k], (e4m3 tokens, FP32 row-major scales)) of received rows."""
    ids, weights, scales = received_routing(metadata, k)
    return ids, weights, (codes.view(torch.float8_e4m3fn), scales.contiguous().view(torch.float32))


def _combine_layout(slot_to_row: torch.Tensor, num_slots: int, rows: int) -> MoeLayout:
    """The combine buffer's layout: its first num_slots rows one segment holding the slots at slot_to_row [T, k]
    (-1: a slot no rank kept); what moe_reduce reads of a layout."""
    device = slot_to_row.device
    row_index = torch.arange(rows, device=device)
    row_to_slot = torch.full((rows,), -1, dtype=torch.int32, device=device)
    kept = slot_to_row.view(-1) >= 0
    row_to_slot.scatter_(0, torch.where(kept, slot_to_row.view(-1).long(), rows - 1),
                         torch.where(kept, torch.arange(num_slots, device=device), -1).to(torch.int32))
    return MoeLayout(counts=torch.full((1,), num_slots, dtype=torch.int32, device=device),
                     num_rows=torch.full((1,), rows, dtype=torch.int32, device=device),
                     m_indices=torch.where(row_index < num_slots, 0, -1).to(torch.int32),
                     row_to_slot=row_to_slot, slot_to_row=slot_to_row.to(torch.int32).contiguous())


class ContiguousRoutes(NamedTuple):
    """Where the contiguous exchange moves the rows of a range of this rank's tokens, from the exchange of counts:
    the split sizes of all_to_all_single (per rank: tokens this rank sends it and gets from it, slots it has there
    and holds for it) and the order of the rows on either side."""

    sent_tokens: list
    got_tokens: list
    sent_slots: list
    got_slots: list
    token: torch.Tensor  # int64: the tokens this rank sends, those for rank 0 first, each rank's in token order
    slot_to_row: torch.Tensor  # [tokens, k]: each slot's row in the buffer the rows come back to (combine's)
    first_slot: int  # where the range's rows start in that buffer: its first token times k


# The contiguous forward's overlap of exchanges and GEMMs. Each chunk reads every local expert's weights again, so a
# chunk's grouped GEMMs must stay bound by the tensor cores: an H200 does about 410 FP8 flops a byte of HBM, and an
# expert's M rows do 2 M flops a weight byte. NOTE: an estimate from those rates, not measured on two GPUs.
OVERLAP_CHUNKS = 2
OVERLAP_MIN_ROWS_PER_EXPERT = 256


def overlap_min_tokens(num_experts: int, k: int) -> int:
    """The fewest tokens over the ranks that the contiguous forward moves in OVERLAP_CHUNKS chunks: each chunk then
    gives every expert OVERLAP_MIN_ROWS_PER_EXPERT of its k slots a token on average."""
    return ceil_div(OVERLAP_MIN_ROWS_PER_EXPERT * num_experts * OVERLAP_CHUNKS, k)


def chunked_routes(indices: torch.Tensor, world: int, num_local: int, group, chunks: int,
                   min_tokens: int = 0) -> list:
    """The routes of `chunks` consecutive ranges of this rank's tokens (torch.tensor_split's) by their global expert
    ids [T, k]; or of all of them in one when the W ranks have fewer than min_tokens tokens in all. One exchange of
    counts, a host synchronization, which also tells each rank every rank's T, so that all choose alike."""
    num_tokens = indices.shape[0]
    slot_rank, hit = _token_ranks(indices, world, num_local)
    pieces = list(zip(slot_rank.tensor_split(chunks), hit.tensor_split(chunks)))
    columns = []
    for piece_rank, piece_hit in pieces:
        columns += [piece_hit.sum(0), torch.bincount(piece_rank.view(-1), minlength=world)]
    columns.append(torch.full((world,), num_tokens, dtype=torch.int64, device=indices.device))
    counts = torch.stack(columns, dim=1).to(torch.int32)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    # Per piece, the tokens and the slots per rank (lists of W), sent and received; then each rank's T.
    sent, got = torch.stack([counts, received]).transpose(1, 2).tolist()
    if sum(got[-1]) < min_tokens:
        sent, got = ([_summed(table[0:-1:2]), _summed(table[1:-1:2])] for table in (sent, got))
        pieces = [(slot_rank, hit)]
    routes, first_token = [], 0
    for c, (piece_rank, piece_hit) in enumerate(pieces):
        routes.append(_piece_routes(piece_rank, piece_hit, first_token, sent[2 * c:2 * c + 2], got[2 * c:2 * c + 2]))
        first_token += piece_hit.shape[0]
    return routes


def _summed(lists: list) -> list:
    """The elementwise sum of lists of equal length."""
    return [sum(values) for values in zip(*lists)]


def _piece_routes(slot_rank: torch.Tensor, hit: torch.Tensor, first_token: int, sent: list,
                  got: list) -> ContiguousRoutes:
    """The routes of the tokens [first_token, first_token + len(slot_rank)) from _token_ranks' rows of them and their
    exchanged counts ([tokens, slots] per rank, sent and received)."""
    num_tokens, k = slot_rank.shape
    token = _first_true(hit.t().reshape(-1), sum(sent[0])) % max(num_tokens, 1) + first_token
    by_rank = torch.argsort(slot_rank.reshape(-1), stable=True)
    slot_to_row = _scatter_index(by_rank, torch.ones_like(by_rank, dtype=torch.bool), num_tokens * k)
    first_slot = first_token * k
    return ContiguousRoutes(sent[0], got[0], sent[1], got[1], token,
                            (slot_to_row + first_slot).view(num_tokens, k), first_slot)


def contiguous_routes(indices: torch.Tensor, world: int, num_local: int, group) -> ContiguousRoutes:
    """The routes of all of this rank's slots (global expert ids [T, k]) in one range."""
    return chunked_routes(indices, world, num_local, group, 1)[0]


def start_dispatch(rows: torch.Tensor, routes: ContiguousRoutes, group) -> tuple:
    """Each of the routes' tokens' row of rows [T, ...] to every rank that holds one of its experts, asynchronously:
    (the rows this rank receives, by source rank, each source's in token order; the exchange's work to wait on)."""
    sent = rows.index_select(0, routes.token)
    received = sent.new_empty((sum(routes.got_tokens), *rows.shape[1:]))
    work = dist.all_to_all_single(received, sent, routes.got_tokens, routes.sent_tokens, group=group, async_op=True)
    return received, work


def dispatch(rows: torch.Tensor, routes: ContiguousRoutes, group) -> torch.Tensor:
    """start_dispatch's received rows, once they are there."""
    received, work = start_dispatch(rows, routes, group)
    work.wait()
    return received


def kept_slot_rows(layout: MoeLayout, count: int) -> torch.Tensor:
    """int64 rows of the expert outputs that hold the received slots this rank's experts take, in slot order."""
    slot_rows = layout.slot_to_row.view(-1)
    return slot_rows[_first_true(slot_rows >= 0, count)].long()


def combine_buffer(rows: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The buffer the T * k = num_slots slots' rows come back to: contiguous_max_rows(num_slots, 1) rows like
    rows' (what reduce_slots reads)."""
    return rows.new_empty((contiguous_max_rows(num_slots, 1), *rows.shape[1:]))


def start_combine(returned: torch.Tensor, rows: torch.Tensor, routes: ContiguousRoutes, group):
    """Each kept slot's row (rows: in kept_slot_rows order) back to its token's rank, asynchronously: the routes'
    slots' rows land in returned (combine_buffer's) at routes.slot_to_row. Returns the exchange's work."""
    first, count = routes.first_slot, routes.slot_to_row.numel()
    return dist.all_to_all_single(returned[first:first + count], rows, routes.sent_slots, routes.got_slots,
                                  group=group, async_op=True)


def combine(rows: torch.Tensor, routes: ContiguousRoutes, group) -> torch.Tensor:
    """start_combine into a new combine_buffer of the routes' slots (which start at slot 0), once it is done."""
    returned = combine_buffer(rows, routes.slot_to_row.numel())
    start_combine(returned, rows, routes, group).wait()
    return returned


def reduce_slots(moe_reduce, returned: torch.Tensor, slot_to_row: torch.Tensor, weights: torch.Tensor,
                 out_dtype=torch.bfloat16) -> torch.Tensor:
    """Each token's slot rows (combine's buffer, slot (t, j) at row slot_to_row[t, j]) summed in slot order in FP32
    by moe_reduce (the kernel or its reference), as out_dtype."""
    layout = _combine_layout(slot_to_row, slot_to_row.numel(), returned.shape[0])
    return moe_reduce(returned, layout, torch.ones_like(weights), out_dtype=out_dtype)


def _contiguous_exchange(x, weights, indices, rank, num_local, experts, routes: list, group, kernels):
    k, hidden = indices.shape[1], x.shape[1]
    # Dispatch: FP8 codes (as bytes) and, in one int32 exchange, the ids, weights and scales; every chunk's queued
    # at once.
    codes, scales = kernels.per_token_cast_to_fp8(x, scale_layout="row_major")
    codes, metadata = codes.view(torch.uint8), routing_metadata(indices, weights, scales)
    inbound = [(start_dispatch(codes, chunk, group), start_dispatch(metadata, chunk, group)) for chunk in routes]

    # Each chunk's experts, then its kept slots' rows in (received token, j) order (by source rank) on their way back.
    returned = combine_buffer(x, indices.numel())
    outbound = []
    for chunk, ((codes_in, codes_work), (metadata_in, metadata_work)) in zip(routes, inbound):
        codes_work.wait()
        metadata_work.wait()
        rows_out = x.new_empty((0, hidden))
        if codes_in.shape[0] > 0:
            ids_in, weights_in, tokens_in = _received(codes_in, metadata_in, k)
            layout = kernels.moe_layout(kernels.map_global_to_local_experts(ids_in, num_local, rank), num_local)
            expert_out = routed_experts(kernels, tokens_in, weights_in, layout, experts)
            rows_out = expert_out.index_select(0, kept_slot_rows(layout, sum(chunk.got_slots)))
        outbound.append(start_combine(returned, rows_out, chunk, group))
    for work in outbound:
        work.wait()
    slot_to_row = torch.cat([chunk.slot_to_row for chunk in routes])
    return reduce_slots(kernels.moe_reduce, returned, slot_to_row, weights)


def _masked_exchange(x, weights, indices, world, rank, num_local, experts, max_tokens, group, kernels):
    num_tokens, k = indices.shape
    hidden = x.shape[1]
    slot_rank, hit = _token_ranks(indices, world, num_local)
    # Token t's place in the block it sends rank r (its earlier tokens for r before it).
    place = torch.cumsum(hit, 0) - 1
    block_row = torch.arange(world, device=x.device) * num_tokens + place
    entry = _scatter_index(block_row.view(-1), hit.view(-1), world * num_tokens)  # entry = t * W + r
    token = torch.where(entry >= 0, entry // world, -1)
    # Rows past a block's tokens carry ids -1: no slot.
    sent_token = token.clamp(min=0)
    codes, scales = kernels.per_token_cast_to_fp8(x, scale_layout="row_major")
    metadata = routing_metadata(torch.where((token >= 0).unsqueeze(1), indices.index_select(0, sent_token), -1),
                         weights.index_select(0, sent_token), scales.index_select(0, sent_token))
    codes_out = codes.view(torch.uint8).index_select(0, sent_token)
    codes_in = torch.empty_like(codes_out)
    dist.all_to_all_single(codes_in, codes_out, group=group)
    metadata_in = torch.empty_like(metadata)
    dist.all_to_all_single(metadata_in, metadata, group=group)

    ids_in, weights_in, tokens_in = _received(codes_in, metadata_in, k)
    received = world * num_tokens
    capacity = masked_capacity(received, max_tokens)
    layout = kernels.moe_layout(kernels.map_global_to_local_experts(ids_in, num_local, rank), num_local, capacity)
    expected_m = min(capacity, ceil_div(received * k, num_local * world))
    expert_out = routed_experts(kernels, tokens_in, weights_in, layout, experts, expected_m)
    # Each received slot's row in the flattened [n * capacity] rows, -1 where none (another rank's, or dropped).
    slot_rows = _scatter_index(layout.masked_slots.view(-1), layout.masked_slots.view(-1) >= 0, received * k)
    rows_out = expert_out.view(-1, hidden).index_select(0, slot_rows.clamp(min=0))
    rows_back = torch.empty_like(rows_out)
    dist.all_to_all_single(rows_back, rows_out, group=group)
    kept_back = torch.empty_like(slot_rows)
    dist.all_to_all_single(kept_back, slot_rows, group=group)

    # Slot (t, j) came back from rank r = slot_rank[t, j] at row (r * T + place[t, r]) * k + j.
    num_slots = num_tokens * k
    source = ((block_row.gather(1, slot_rank)) * k + torch.arange(k, device=x.device)).view(-1)
    combined = x.new_empty((contiguous_max_rows(num_slots, 1), hidden))
    torch.index_select(rows_back, 0, source, out=combined[:num_slots])
    slot_to_row = torch.where(kept_back.index_select(0, source) >= 0, torch.arange(num_slots, device=x.device), -1)
    layout = _combine_layout(slot_to_row.view(num_tokens, k), num_slots, combined.shape[0])
    return kernels.moe_reduce(combined, layout, torch.ones_like(weights))
