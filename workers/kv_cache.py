"""Preallocated KV cache: one fixed slot per running sequence.

Each slot holds up to `max_len` positions for every layer. A slot's length is the number of
positions that are valid; rolling back rejected draft positions is `truncate(slot, n)`: the
stale keys stay in memory and are overwritten by the next write, never read (the attention mask
stops at the length). The model writes valid tokens only (packed); one extra scratch column
(index `max_len`) can absorb the padding of a caller that writes a padded (B, T) batch.
"""

from __future__ import annotations

import numpy as np
import torch


class KVCache:
    def __init__(self, n_layers: int, n_slots: int, n_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (n_layers, n_slots, n_kv_heads, max_len + 1, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, slots, nkv, max_len + 1, hd)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.n_slots = n_slots
        self.lengths = np.zeros(n_slots, dtype=np.int64)  # valid positions per slot (host copy)
        self._free = list(range(n_slots - 1, -1, -1))

    # ---- slot bookkeeping -------------------------------------------------------------------
    def allocate(self) -> int:
        """Claim a free slot (length 0). Raises RuntimeError when all slots are in use."""
        if not self._free:
            raise RuntimeError(f"KV cache full: all {self.n_slots} slots are in use")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        self.lengths[slot] = 0
        self._free.append(slot)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def truncate(self, slot: int, length: int) -> None:
        """Roll a slot back to `length` valid positions (drop rejected draft positions)."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        self.lengths[slot] = length

    def lengths_t(self, slots: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.lengths[slots.cpu().numpy()]).to(self.k.device)

    def advance(self, slots: torch.Tensor, n_new: torch.Tensor) -> None:
        self.lengths[slots.cpu().numpy()] += n_new.cpu().numpy()

    # ---- tensor access (called by attention) ------------------------------------------------
    def write(self, layer: int, slots: torch.Tensor, pos: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Each new token's slot and position: slots and pos of one shape (...), e.g. (B, T) or
        packed (N,); k, v: (..., nkv, hd)."""
        # advanced indices around a slice: the indexed view has shape (..., nkv, hd)
        self.k[layer][slots, :, pos] = k.to(self.k.dtype)
        self.v[layer][slots, :, pos] = v.to(self.v.dtype)

    @staticmethod
    def slot_index(slots: torch.Tensor | np.ndarray) -> slice | torch.Tensor:
        """A slice when the slots are consecutive (reads are then views, not copies), else the
        slots as a tensor (host slots: on the host; the caller moves them)."""
        h = slots.cpu().numpy() if torch.is_tensor(slots) else slots
        if (np.diff(h) == 1).all():
            return slice(int(h[0]), int(h[0]) + len(h))
        return slots if torch.is_tensor(slots) else torch.from_numpy(slots)

    def read(self, layer: int, index: slice | torch.Tensor, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the first `span` positions: two (B, nkv, span, hd) tensors."""
        return self.k[layer, index, :, :span], self.v[layer, index, :, :span]
