"""A slot-based KV cache pool for the engine.

``max_batch_size`` slots, each able to hold ``max_position`` tokens for every
layer. A request owns one slot from admission to completion. Per layer the
pool holds ``k``/``v`` tensors ``[slots, local_kv_heads, max_position,
head_dim]`` (heads before positions, so one gather yields the
``[rows, heads, length, head_dim]`` operand of the attention matmuls). A
request reads its own slot's prefix, so the values it sees never depend on
which slot it got or on the other slots' contents; the layout only moves
values, it never changes them.
"""

from __future__ import annotations

import torch


class KVCachePool:
    def __init__(
        self,
        *,
        layers: int,
        slots: int,
        max_position: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (slots, kv_heads, max_position, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.max_position = max_position
        self.kv_heads = kv_heads
        self._free = list(range(slots))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("KV cache pool exhausted (more active requests than max_batch_size)")
        return self._free.pop(0)

    def reserve(self, slot: int) -> int:
        """Take the free ``slot`` out of circulation for good (``allocate`` never returns it;
        the CUDA-graph decode's scratch slot for padding rows). Returns ``slot``."""
        if slot not in self._free:
            raise RuntimeError(f"KV cache slot {slot} is not free")
        self._free.remove(slot)
        return slot

    def release(self, slot: int) -> None:
        if slot in self._free:
            raise RuntimeError(f"KV cache slot {slot} released twice")
        self._free.append(slot)
        self._free.sort()

    # -- one request (prefill) -----------------------------------------------------

    def write(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` ``[T, kv_heads, head_dim]`` at positions ``[start, start+T)``."""
        end = start + k.shape[0]
        if end > self.max_position:
            raise RuntimeError(f"sequence length {end} exceeds model.max_position ({self.max_position})")
        self.k[layer][slot, :, start:end] = k.transpose(0, 1)
        self.v[layer][slot, :, start:end] = v.transpose(0, 1)

    def read(self, layer: int, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``length`` cached positions as ``[1, length, kv_heads, head_dim]`` (views)."""
        k = self.k[layer][slot : slot + 1, :, :length].transpose(1, 2)
        v = self.v[layer][slot : slot + 1, :, :length].transpose(1, 2)
        return k, v

    # -- many requests, one new token each (batched decode) ----------------------------

    def row_index(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``[B * kv_heads]`` flat rows of ``(slots[i], head, positions[i])`` for ``write_rows``."""
        heads = torch.arange(self.kv_heads, device=slots.device)
        return ((slots.view(-1, 1) * self.kv_heads + heads) * self.max_position + positions.view(-1, 1)).view(-1)

    def head_index(self, slots: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """``[n * len(heads)]`` flat ``(slot, kv head)`` indices for ``gather``."""
        return (slots.view(-1, 1) * self.kv_heads + heads.view(1, -1)).view(-1)

    def write_rows(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` ``[B, kv_heads, head_dim]`` at the ``row_index`` rows (exact copies).

        The caller guarantees in-range positions and distinct slots.
        """
        d = k.shape[-1]
        self.k[layer].view(-1, d).index_copy_(0, rows, k.reshape(-1, d))
        self.v[layer].view(-1, d).index_copy_(0, rows, v.reshape(-1, d))

    def gather(self, layer: int, heads: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[len(heads), length, head_dim]`` copies of the first ``length`` positions of the
        ``head_index`` entries: with one entry per (request, query head) this is ``read``
        transposed and ``repeat_interleave``d over the GQA groups, in one copy."""
        k = self.k[layer]
        rows = k.shape[0] * k.shape[1]
        k = k.view(rows, self.max_position, -1)[:, :length].index_select(0, heads)
        v = self.v[layer].view(rows, self.max_position, -1)[:, :length].index_select(0, heads)
        return k, v

    def copy_prefix(self, src: int, dst: list[int], length: int) -> None:
        """Copy slot ``src``'s first ``length`` positions into every slot of ``dst`` (exact)."""
        index = torch.tensor(dst, device=self.k[0].device)
        for cache in (*self.k, *self.v):
            cache[index, :, :length] = cache[src, :, :length]
