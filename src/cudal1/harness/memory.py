"""Device-memory hygiene inside the worker: L2 flushing and poisoning of freed allocator blocks.

``poison_free_blocks()`` fills every inactive block of PyTorch's CUDA caching allocator with 0xFF
bytes (NaN in every float format) so that a candidate allocating an uninitialised tensor cannot
find the reference's previous result in it.  It does not reach memory already returned to the
driver, nor memory a candidate holds through raw pointers; ``empty_cache`` is not called, since
cudaMalloc'd memory from the driver is not zeroed either.
"""

from __future__ import annotations

import torch

_MAX_BLOCKS = 4096


def poison_free_blocks(device: torch.device) -> int:
    """Overwrite the caching allocator's free blocks on ``device``; return bytes poisoned."""
    if device.type != "cuda":
        return 0
    sizes: list[int] = []
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", 0) != (device.index or 0):
            continue
        if tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0):
            continue  # private pools (CUDA graphs) are not reachable by ordinary allocations
        for block in segment.get("blocks", []):
            if block.get("state") == "inactive" and block.get("size", 0) > 0:
                sizes.append(int(block["size"]))
    sizes.sort(reverse=True)
    held = []
    total = 0
    for size in sizes[:_MAX_BLOCKS]:
        try:
            buf = torch.empty(size, dtype=torch.uint8, device=device)
        except torch.OutOfMemoryError:
            break
        buf.fill_(0xFF)
        held.append(buf)
        total += size
    del held
    return total


class L2Flusher:
    """Writes a buffer twice the L2 size so no timed call starts with its data in L2."""

    def __init__(self, device: torch.device) -> None:
        self.buffer = None
        if device.type == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 2**20
            self.buffer = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        if self.buffer is not None:
            self.buffer.zero_()
