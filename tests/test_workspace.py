"""deep_kernels.workspace: persistent buffers come from a thread of their own (CPU, with torch's CUDA calls
replaced)."""

import threading

import torch

from deep_kernels import workspace


def test_persistent_buffers_are_allocated_off_the_calling_thread(monkeypatch):
    # The allocator routes a CUDA graph's (or inductor's warm-up's) allocations by the calling thread: a buffer the
    # calls keep must be allocated by another one, and then marked as used on the caller's stream.
    allocating_threads, recorded_streams = [], []

    def empty(numel, dtype, device):
        allocating_threads.append(threading.get_ident())
        return torch.zeros(numel, dtype=dtype)

    monkeypatch.setattr(workspace.torch, "empty", empty)
    monkeypatch.setattr(workspace.torch.cuda, "current_stream", lambda device: ("stream of", device))
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda tensor, stream: recorded_streams.append(stream),
                        raising=False)
    buffer = workspace.persistent_empty(10, torch.int32, 3)
    assert buffer.shape == (10,) and buffer.dtype == torch.int32
    assert allocating_threads and threading.get_ident() not in allocating_threads
    assert recorded_streams == [("stream of", torch.device("cuda", 3))]
