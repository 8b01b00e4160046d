"""A slot-based KV cache pool for the engine.

``max_batch_size`` slots, each able to hold ``max_position`` tokens for every
layer. A request owns one slot from admission to completion. Per layer the
pool holds ``k``/``v`` tensors ``[slots, max_position, local_kv_heads,
head_dim]``; a request reads its own slot's prefix, so the values it sees
never depend on which slot it got or on the other slots' contents.
"""

from __future__ import annotations

import torch


class KVCachePool:
    def __init__(
        self, *, layers: int, slots: int, max_position: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (slots, max_position, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.max_position = max_position
        self._free = list(range(slots))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("KV cache pool exhausted (more active requests than max_batch_size)")
        return self._free.pop(0)

    def release(self, slot: int) -> None:
        if slot in self._free:
            raise RuntimeError(f"KV cache slot {slot} released twice")
        self._free.append(slot)
        self._free.sort()

    def write(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` ``[T, kv_heads, head_dim]`` at positions ``[start, start+T)``."""
        end = start + k.shape[0]
        if end > self.max_position:
            raise RuntimeError(f"sequence length {end} exceeds model.max_position ({self.max_position})")
        self.k[layer][slot, start:end] = k
        self.v[layer][slot, start:end] = v

    def read(self, layer: int, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``length`` cached positions as ``[1, length, kv_heads, head_dim]``."""
        return self.k[layer][slot : slot + 1, :length], self.v[layer][slot : slot + 1, :length]
