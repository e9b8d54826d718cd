"""fa_attn.bert_padding: flash_attn.bert_padding's helpers, by their definitions."""

from __future__ import annotations

import torch
from fa_attn.standin import bert_padding


def test_unpad_input_layout() -> None:
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.int32)  # left and right padding in one row
    rows, indices, cu_seqlens, max_seqlen, seqused = bert_padding.unpad_input(hidden, mask)
    assert indices.tolist() == [1, 2, 4, 5, 6, 7]
    assert cu_seqlens.dtype == torch.int32
    assert cu_seqlens.tolist() == [0, 2, 6]
    assert isinstance(max_seqlen, int)
    assert max_seqlen == 4
    assert seqused.dtype == torch.int32
    assert seqused.tolist() == [2, 4]
    assert torch.equal(rows, hidden.reshape(8, 3)[indices])


def test_unused_mask_keeps_rows_but_not_usage() -> None:
    hidden = torch.randn(1, 5, 2)
    mask = torch.tensor([[1, 1, 0, 0, 0]], dtype=torch.bool)
    unused = torch.tensor([[0, 0, 1, 1, 0]], dtype=torch.bool)
    rows, indices, cu_seqlens, max_seqlen, seqused = bert_padding.unpad_input(hidden, mask, unused)
    assert torch.equal(rows, hidden[0, :4])
    assert indices.tolist() == [0, 1, 2, 3]
    assert cu_seqlens.tolist() == [0, 4]
    assert max_seqlen == 4
    assert seqused.tolist() == [2]


def test_pad_input_inverts_unpad_and_zeros_the_rest() -> None:
    hidden = torch.randn(3, 6, 2, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(3, 6, generator=torch.Generator().manual_seed(0)) > 0.4
    rows, indices, *_ = bert_padding.unpad_input(hidden, mask)
    padded = bert_padding.pad_input(rows, indices, 3, 6)
    assert torch.equal(padded, hidden * mask[..., None, None])
    (grad,) = torch.autograd.grad(padded.sum(), hidden)  # differentiable: ones where the mask keeps a row
    assert torch.equal(grad, mask[..., None, None].expand_as(hidden).double())


def test_index_helpers() -> None:
    values = torch.randn(3, 2)
    indices = torch.tensor([4, 0, 2])
    scattered = bert_padding.index_put_first_axis(values, indices, 5)
    assert torch.equal(bert_padding.index_first_axis(scattered, indices), values)
    assert torch.equal(scattered[[1, 3]], torch.zeros(2, 2))
