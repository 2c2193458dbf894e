"""Device buffers that the kernels' calls keep from one call to the next (workspaces grown on demand)."""

from concurrent.futures import ThreadPoolExecutor

import torch


def persistent_empty(numel: int, dtype: torch.dtype, device_index: int) -> torch.Tensor:
    """An uninitialized [numel] tensor from the caching allocator's default pool, for a cache that outlives the call.

    While a CUDA graph is captured, or torch.compile's CUDA graph trees run a graph's warm-up, the allocator routes
    the calling thread's allocations to the graph's private pool: a cached buffer allocated there would be reused by
    the graph's own tensors, and inductor refuses a warm-up that leaves one alive ("tensor(s) in the cudagraph pool
    not tracked as outputs"). So a thread of its own allocates it, from the default pool; the buffer is then marked
    as used on the caller's current stream, which the allocator waits for before it reuses the memory once freed.
    """
    device = torch.device("cuda", device_index)
    with ThreadPoolExecutor(max_workers=1) as thread:
        tensor = thread.submit(torch.empty, numel, dtype=dtype, device=device).result()
    tensor.record_stream(torch.cuda.current_stream(device))
    return tensor
