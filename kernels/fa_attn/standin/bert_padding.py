"""flash_attn.bert_padding's helpers that models import: padded <-> packed (unpadded) token layouts.

unpad_input turns (batch, seqlen, ...) plus a (batch, seqlen) mask into the packed (total, ...) rows
flash_attn_varlen_func takes, with the cu_seqlens and max_seqlen that describe them; pad_input puts
packed rows back (zeros elsewhere). Same signatures and return values as flash-attn 2.x; plain torch
indexing, differentiable by ordinary autograd.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def index_first_axis(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """tensor[indices] along dim 0: (n, ...) -> (len(indices), ...)."""
    return tensor[indices]


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
    """A zero tensor of first_axis_dim rows with values scattered to rows `indices`."""
    output = values.new_zeros((first_axis_dim, *values.shape[1:]))
    return output.index_put((indices,), values)


def unpad_input(
    hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """(batch, seqlen, ...) and a (batch, seqlen) bool/int mask (1 = token) ->
    (rows (total, ...), indices (total,) into the flattened batch * seqlen, cu_seqlens (batch + 1,) int32,
    max_seqlen_in_batch (int), seqused (batch,) int32: tokens of attention_mask alone).
    unused_mask marks rows that are allocated but unused: they are kept in the rows and cu_seqlens."""
    kept = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    rows = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    return rows, indices, cu_seqlens, max_seqlen, used


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Packed rows (total, ...) back to (batch, seqlen, ...), zeros where no row was."""
    output = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return output.reshape(batch, seqlen, *hidden_states.shape[1:])


def index_first_axis_residual(
    tensor: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tensor[indices], tensor detached): flash-attn's pair for a residual branch whose gradient flows
    back through the first item only (and through the caller's use of the second)."""
    return tensor[indices], tensor.detach()


def unpad_input_for_concatenated_sequences(
    hidden_states: torch.Tensor, attention_mask_in_length: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Several short sequences packed in each row: attention_mask_in_length (batch, seqlen) holds row b's
    sequence lengths first, then zeros (e.g. [2, 3, 0, 0, 0, 0]: two sequences of 2 and 3 tokens) ->
    (rows (total, ...), indices into batch * seqlen, cu_seqlens (sequences + 1,) int32, longest sequence).
    Every sequence becomes its own varlen sequence, so none attends to its row neighbours."""
    lengths_per_row = attention_mask_in_length.sum(dim=-1)
    seqlen = attention_mask_in_length.shape[-1]
    positions = torch.arange(seqlen, device=lengths_per_row.device, dtype=lengths_per_row.dtype)
    kept = positions.expand(lengths_per_row.shape[0], seqlen) < lengths_per_row.unsqueeze(1)
    flat_lengths = attention_mask_in_length.flatten()
    seqlens = flat_lengths[flat_lengths != 0]
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    rows = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    return rows, indices, cu_seqlens, max_seqlen
