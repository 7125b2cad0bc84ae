"""Device-memory hygiene inside the worker: poisoning of freed allocator blocks.

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
