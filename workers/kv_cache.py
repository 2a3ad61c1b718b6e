"""Preallocated KV cache: one fixed slot per running sequence.

Each slot holds up to `max_len` positions for every layer. A slot's length is the number of
positions that are valid; rolling back rejected draft positions is `truncate(slot, n)`: the
stale keys stay in memory and are overwritten by the next write, never read (the attention mask
stops at the length). The model writes valid tokens only (packed); one extra scratch column
(index `max_len`) can absorb the padding of a caller that writes a padded (B, T) batch.

Slots are what callers hold; the tensors are indexed by physical rows (`rows`). The slots in use
sit in rows 0..used-1: releasing a slot moves the last row's sequence into its row. A batch of
every running sequence then reads its keys as a view. Where rows had holes (a closed batch whose
sequences finish at different steps), every layer gathered the batch's keys: on the CPU pair, a
target pass of 12-48 rows in a 64-slot cache took 1.1-1.4x its time, one of 56 rows 4-6x.
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
        self.row = np.arange(n_slots, dtype=np.int64)  # (slots,) each slot's row in k and v
        self._slot_at = np.arange(n_slots, dtype=np.int64)  # (slots,) the slot in each row
        self._used = 0  # slots in use: they hold rows 0.._used-1

    # ---- slot bookkeeping -------------------------------------------------------------------
    def allocate(self) -> int:
        """Claim a free slot (length 0). Raises RuntimeError when all slots are in use."""
        if not self._free:
            raise RuntimeError(f"KV cache full: all {self.n_slots} slots are in use")
        slot = self._free.pop()
        self.lengths[slot] = 0
        self._swap(slot, int(self._slot_at[self._used]))  # the first unused row (holds no live keys)
        self._used += 1
        return slot

    def release(self, slot: int) -> None:
        """Free a slot; the sequence in the last used row moves into its row (keys copied)."""
        if self.row[slot] < self._used:
            last = int(self._slot_at[self._used - 1])
            if last != slot:
                src, dst, n = self.row[last], self.row[slot], int(self.lengths[last])
                self.k[:, dst, :, :n] = self.k[:, src, :, :n]
                self.v[:, dst, :, :n] = self.v[:, src, :, :n]
                self._swap(slot, last)
            self._used -= 1
        self.lengths[slot] = 0
        self._free.append(slot)

    def _swap(self, a: int, b: int) -> None:
        """Exchange two slots' rows."""
        ra, rb = self.row[a], self.row[b]
        self.row[a], self.row[b] = rb, ra
        self._slot_at[ra], self._slot_at[rb] = b, a

    def rows(self, slots: np.ndarray) -> np.ndarray:
        """(B,) slots -> (B,) their rows in k and v."""
        return self.row[slots]

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
    def write(self, layer: int, rows: torch.Tensor, pos: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Each new token's row (`rows`, not slots) and position: rows and pos of one shape (...),
        e.g. (B, T) or packed (N,); k, v: (..., nkv, hd)."""
        # advanced indices around a slice: the indexed view has shape (..., nkv, hd)
        self.k[layer][rows, :, pos] = k.to(self.k.dtype)
        self.v[layer][rows, :, pos] = v.to(self.v.dtype)

    @staticmethod
    def slot_index(rows: torch.Tensor | np.ndarray) -> slice | torch.Tensor:
        """A slice when the rows are consecutive (reads are then views, not copies), else the
        rows as a tensor (host rows: on the host; the caller moves them)."""
        h = rows.cpu().numpy() if torch.is_tensor(rows) else rows
        if (np.diff(h) == 1).all():
            return slice(int(h[0]), int(h[0]) + len(h))
        return rows if torch.is_tensor(rows) else torch.from_numpy(rows)

    def read(self, layer: int, index: slice | torch.Tensor, span: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the first `span` positions of rows `index` (`slot_index`): two
        (B, nkv, span, hd) tensors."""
        return self.k[layer, index, :, :span], self.v[layer, index, :, :span]
