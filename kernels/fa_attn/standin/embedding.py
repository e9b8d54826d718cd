"""flash-attn's embedding modules (flash_attn.modules.embedding) for the stand-in, in plain torch with
flash-attn 2.8.3's constructors, forward arguments and parameter names (word_embeddings,
position_embeddings, token_type_embeddings, project_in), so their checkpoints load with strict=True.

  GPT2Embeddings: word + position embeddings (none when max_position_embeddings <= 0; positions
    0..seqlen-1 unless position_ids are given); with word_embed_proj_dim, the word embeddings have that
    width and project_in (a bias-free Linear) maps them to embed_dim before the positions are added.
  BertEmbeddings: the same plus token type embeddings (type 0 unless token_type_ids are given).
  VocabParallelEmbedding: this rank's contiguous rows of the vocabulary; ids outside them embed to 0
    (the ranks' outputs sum to the full embedding). ColumnParallelEmbedding: this rank's columns.
  ParallelGPT2Embeddings: both; the ranks' partial sums reduce-scattered (sequence_parallel) or
    all-reduced, over (batch * seqlen) rows with combine_batch_seqlen_dim.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..runtime.inputs import InputError
from .tensor_parallel import all_reduce, reduce_scatter

Tensor = torch.Tensor


def _positions(input_ids: Tensor, position_ids: Tensor | None) -> Tensor:
    if position_ids is not None:
        return position_ids
    return torch.arange(input_ids.shape[1], dtype=torch.long, device=input_ids.device)


class GPT2Embeddings(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        vocab_size: int,
        max_position_embeddings: int,
        padding_idx: int | None = None,
        word_embed_proj_dim: int | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        width = embed_dim if word_embed_proj_dim is None else word_embed_proj_dim
        self.word_embeddings = nn.Embedding(
            vocab_size, width, padding_idx=padding_idx, device=device, dtype=dtype
        )
        self.project_in = (
            None
            if word_embed_proj_dim is None
            else nn.Linear(word_embed_proj_dim, embed_dim, bias=False, device=device, dtype=dtype)
        )
        self.max_position_embeddings = max_position_embeddings
        if max_position_embeddings > 0:
            self.position_embeddings = nn.Embedding(
                max_position_embeddings, embed_dim, device=device, dtype=dtype
            )

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """input_ids, position_ids (batch, seqlen) -> (batch, seqlen, embed_dim)."""
        embeddings: Tensor = self.word_embeddings(input_ids)
        if self.project_in is not None:
            embeddings = self.project_in(embeddings)
        if self.max_position_embeddings > 0:
            embeddings = embeddings + self.position_embeddings(_positions(input_ids, position_ids))
        return embeddings


class BertEmbeddings(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        vocab_size: int,
        max_position_embeddings: int,
        type_vocab_size: int,
        padding_idx: int | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(
            vocab_size, embed_dim, padding_idx=padding_idx, device=device, dtype=dtype
        )
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        if max_position_embeddings > 0:
            self.position_embeddings = nn.Embedding(
                max_position_embeddings, embed_dim, device=device, dtype=dtype
            )
        if type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(type_vocab_size, embed_dim, device=device, dtype=dtype)

    def forward(
        self, input_ids: Tensor, position_ids: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        embeddings: Tensor = self.word_embeddings(input_ids)
        if self.max_position_embeddings > 0:
            embeddings = embeddings + self.position_embeddings(_positions(input_ids, position_ids))
        if self.type_vocab_size > 0:
            if token_type_ids is None:
                token_type_ids = torch.zeros(input_ids.shape[1], dtype=torch.long, device=input_ids.device)
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return embeddings


def _world(process_group: Any) -> int:
    return 1 if process_group is None else dist.get_world_size(process_group)


class VocabParallelEmbedding(nn.Embedding):
    def __init__(
        self,
        num_embeddings: int,
        *args: Any,
        process_group: Any = None,
        padding_idx: int | None = None,
        **kwargs: Any,
    ) -> None:
        world = _world(process_group)
        if num_embeddings % world:
            raise InputError(f"num_embeddings ({num_embeddings}) must be divisible by world_size ({world})")
        if world > 1 and padding_idx is not None:
            raise InputError("padding_idx: ParallelEmbedding does not support padding_idx (as in flash-attn)")
        super().__init__(num_embeddings // world, *args, padding_idx=padding_idx, **kwargs)  # type: ignore[misc]
        self.process_group = process_group

    def forward(self, input: Tensor) -> Tensor:
        if self.process_group is None:
            return super().forward(input)
        start = dist.get_rank(self.process_group) * self.num_embeddings
        outside = (input < start) | (input >= start + self.num_embeddings)
        embeddings = super().forward((input - start).masked_fill(outside, 0))
        return embeddings.masked_fill(outside.unsqueeze(-1), 0.0)


class ColumnParallelEmbedding(nn.Embedding):
    def __init__(
        self, num_embeddings: int, embedding_dim: int, *args: Any, process_group: Any = None, **kwargs: Any
    ) -> None:
        world = _world(process_group)
        if embedding_dim % world:
            raise InputError(f"embedding_dim ({embedding_dim}) must be divisible by world_size ({world})")
        super().__init__(num_embeddings, embedding_dim // world, *args, **kwargs)
        self.process_group = process_group


class ParallelGPT2Embeddings(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        vocab_size: int,
        max_position_embeddings: int,
        process_group: Any,
        padding_idx: int | None = None,
        sequence_parallel: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.process_group = process_group
        self.sequence_parallel = sequence_parallel
        self.word_embeddings = VocabParallelEmbedding(
            vocab_size,
            embed_dim,
            padding_idx=padding_idx,
            process_group=process_group,
            device=device,
            dtype=dtype,
        )
        self.max_position_embeddings = max_position_embeddings
        if max_position_embeddings > 0:
            self.position_embeddings = ColumnParallelEmbedding(
                max_position_embeddings, embed_dim, process_group=process_group, device=device, dtype=dtype
            )

    def forward(
        self, input_ids: Tensor, position_ids: Tensor | None = None, combine_batch_seqlen_dim: bool = False
    ) -> Tensor:
        world = _world(self.process_group)
        embeddings: Tensor = self.word_embeddings(input_ids)
        if self.max_position_embeddings > 0:
            positions = self.position_embeddings(_positions(input_ids, position_ids))
            if world <= 1:
                embeddings = embeddings + positions
            else:  # this rank's columns of the position embedding, added once over the ranks' sum
                width = self.position_embeddings.embedding_dim
                first = dist.get_rank(self.process_group) * width
                pad = (first, embeddings.shape[-1] - first - width)
                embeddings = embeddings + torch.nn.functional.pad(positions, pad)
        if combine_batch_seqlen_dim:
            embeddings = embeddings.flatten(0, 1)
        if world <= 1:
            return embeddings
        combine = reduce_scatter if self.sequence_parallel else all_reduce
        combined: Tensor = combine(embeddings, self.process_group)  # type: ignore[no-untyped-call]
        return combined


NAMES = (
    "GPT2Embeddings", "BertEmbeddings", "VocabParallelEmbedding", "ColumnParallelEmbedding",
    "ParallelGPT2Embeddings",
)  # fmt: skip
