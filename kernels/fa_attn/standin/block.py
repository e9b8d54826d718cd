"""flash-attn's transformer blocks (flash_attn.modules.block) for the stand-in, in plain torch with
flash-attn 2.8.3's constructors, forward arguments, results and submodule names (mixer, mlp, norm1,
norm2, dropout1/2, drop_path1/2), so checkpoints load with strict=True.

Block, prenorm (the default): residual = drop_path(dropout(hidden)) + residual (the first block passes
residual None), hidden = norm1(residual), then mixer; the same with norm2 and mlp; returns
(hidden, residual), residual in fp32 with residual_in_fp32. Postnorm: hidden = norm1(drop_path(
dropout(mixer(hidden))) + hidden), the same with the mlp; returns hidden. drop_path is stochastic
depth by row (a whole sample dropped in training, the kept ones scaled by 1 / (1 - p)).
ParallelBlock (GPT-J/NeoX style): residual = dropout1(hidden1) + dropout2(hidden2) + residual, the
mixer reads norm1(residual) and the mlp norm2(residual) (norm1's with tied_norm); returns
(mixer out, mlp out, residual).
fused_dropout_add_ln=True selects flash-attn's fused kernel there; here it is the same arithmetic
(with norm and dropout checked as flash-attn checks them), its dropout drawn from torch's RNG.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from ..runtime.inputs import InputError
from .mha import MHA
from .norms import RMSNorm
from .tensor_parallel import Mlp

Tensor = torch.Tensor


class StochasticDepth(nn.Module):
    """Drop whole rows (dim 0) with probability p in training, scaling the kept ones by 1 / (1 - p)
    (torchvision's StochasticDepth, mode "row")."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty((x.shape[0],) + (1,) * (x.dim() - 1), dtype=x.dtype, device=x.device)
        keep = keep.bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p) if self.p < 1.0 else x * keep


def _check_fused(norm: nn.Module, dropout: nn.Module) -> None:
    if not isinstance(norm, nn.LayerNorm | RMSNorm) or not isinstance(dropout, nn.Dropout):
        raise InputError(
            "fused_dropout_add_ln: needs norm_cls LayerNorm or RMSNorm and dropout_cls nn.Dropout (as in flash-attn)"
        )


def _normed(norm: nn.Module, x: Tensor) -> Tensor:
    """norm(x) with x in the norm's weight dtype (flash-attn's blocks cast the residual so)."""
    weight = norm.weight
    assert isinstance(weight, Tensor)
    out: Tensor = norm(x.to(dtype=weight.dtype))
    return out


def _mark(modules: list[nn.Module | None], flag: str) -> None:
    for module in modules:
        if module is not None:
            for p in module.parameters():
                setattr(p, flag, True)


class _Branches(nn.Module):
    """What both blocks hold: the mixer (default MHA with dim // 64 heads), the mlp (default Mlp with
    4 * dim hidden features), and the KV cache allocation that goes to the mixer."""

    def _branches(
        self,
        dim: int,
        mixer_cls: Callable[[int], nn.Module] | None,
        mlp_cls: Callable[[int], nn.Module] | None,
    ) -> None:
        self.mixer = (mixer_cls or partial(MHA, num_heads=dim // 64))(dim)
        self.mlp = (mlp_cls or partial(Mlp, hidden_features=4 * dim))(dim)

    def _norm_flags(self, norms: list[nn.Module | None], sequence_parallel: bool, shared: bool) -> None:
        if sequence_parallel:
            _mark(norms, "_sequence_parallel")
        if shared:
            _mark(norms, "_shared_params")

    def allocate_inference_cache(
        self, batch_size: int, max_seqlen: int, dtype: torch.dtype | None = None, **kwargs: Any
    ) -> Any:
        return self.mixer.allocate_inference_cache(batch_size, max_seqlen, dtype=dtype, **kwargs)  # type: ignore[operator]


class Block(_Branches):
    def __init__(
        self,
        dim: int,
        mixer_cls: Callable[[int], nn.Module] | None = None,
        mlp_cls: Callable[[int], nn.Module] | None = None,
        norm_cls: Callable[[int], nn.Module] = nn.LayerNorm,
        dropout_cls: Callable[[float], nn.Module] = nn.Dropout,
        prenorm: bool = True,
        resid_dropout1: float = 0.0,
        resid_dropout2: float = 0.0,
        drop_path1: float = 0.0,
        drop_path2: float = 0.0,
        fused_dropout_add_ln: bool = False,
        return_residual: bool = False,
        residual_in_fp32: bool = False,
        sequence_parallel: bool = False,
        mark_shared_params: bool = False,
    ) -> None:
        super().__init__()
        self.prenorm = prenorm
        self.fused_dropout_add_ln = fused_dropout_add_ln
        self.return_residual = return_residual
        self.residual_in_fp32 = residual_in_fp32
        if residual_in_fp32 and not prenorm:
            raise InputError("residual_in_fp32: only with prenorm=True (as in flash-attn)")
        self._branches(dim, mixer_cls, mlp_cls)
        self.dropout1 = dropout_cls(resid_dropout1)
        self.drop_path1 = StochasticDepth(drop_path1)
        self.norm1 = norm_cls(dim)
        self.has_mlp = not isinstance(self.mlp, nn.Identity)
        if self.has_mlp:
            self.dropout2 = dropout_cls(resid_dropout2)
            self.drop_path2 = StochasticDepth(drop_path2)
            self.norm2 = norm_cls(dim)
        if fused_dropout_add_ln:
            _check_fused(self.norm1, self.dropout1)
        self._norm_flags(
            [self.norm1, self.norm2 if self.has_mlp else None], sequence_parallel, mark_shared_params
        )

    def _add_norm(self, hidden: Tensor, residual: Tensor | None, which: int) -> tuple[Tensor, Tensor]:
        """(norm(new residual), new residual) for the prenorm form."""
        dropout, drop_path, norm = (
            (self.dropout1, self.drop_path1, self.norm1)
            if which == 1
            else (self.dropout2, self.drop_path2, self.norm2)
        )
        dropped = drop_path(dropout(hidden))
        residual = dropped + residual if residual is not None else dropped
        hidden = _normed(norm, residual)
        return hidden, residual.float() if self.residual_in_fp32 else residual

    def forward(
        self,
        hidden_states: Tensor,
        residual: Tensor | None = None,
        mixer_subset: Any = None,
        mixer_kwargs: dict[str, Any] | None = None,
    ) -> Any:
        mixer_kwargs = dict(mixer_kwargs or {})
        if self.prenorm:
            hidden_states, residual = self._add_norm(hidden_states, residual, 1)
            if mixer_subset is not None:
                mixer_kwargs["mixer_subset"] = mixer_subset
            hidden_states = self.mixer(hidden_states, **mixer_kwargs)
            if mixer_subset is not None:
                residual = residual[:, mixer_subset]
            if self.has_mlp:
                hidden_states, residual = self._add_norm(hidden_states, residual, 2)
                hidden_states = self.mlp(hidden_states)
            return hidden_states, residual
        if residual is not None:
            raise InputError("residual: a postnorm Block (prenorm=False) takes none")
        mixer_out = self.mixer(hidden_states, **mixer_kwargs)
        if self.return_residual:
            mixer_out, hidden_states = mixer_out
        summed = self.drop_path1(self.dropout1(mixer_out)) + hidden_states
        hidden_states = _normed(self.norm1, summed)
        if self.has_mlp:
            mlp_out = self.mlp(hidden_states)
            if self.return_residual:
                mlp_out, hidden_states = mlp_out
            summed = self.drop_path2(self.dropout2(mlp_out)) + hidden_states
            hidden_states = _normed(self.norm2, summed)
        return hidden_states


class ParallelBlock(_Branches):
    def __init__(
        self,
        dim: int,
        mixer_cls: Callable[[int], nn.Module] | None = None,
        mlp_cls: Callable[[int], nn.Module] | None = None,
        norm_cls: Callable[[int], nn.Module] = nn.LayerNorm,
        dropout_cls: Callable[[float], nn.Module] = nn.Dropout,
        resid_dropout1: float = 0.0,
        resid_dropout2: float = 0.0,
        tied_norm: bool = False,
        fused_dropout_add_ln: bool = False,
        residual_in_fp32: bool = False,
        sequence_parallel: bool = False,
        mark_shared_params: bool = False,
    ) -> None:
        super().__init__()
        self.tied_norm = tied_norm
        self.fused_dropout_add_ln = fused_dropout_add_ln
        self.residual_in_fp32 = residual_in_fp32
        self._branches(dim, mixer_cls, mlp_cls)
        self.dropout1 = dropout_cls(resid_dropout1)
        self.norm1 = norm_cls(dim)
        self.dropout2 = dropout_cls(resid_dropout2)
        self.norm2 = None if tied_norm else norm_cls(dim)
        if fused_dropout_add_ln:
            _check_fused(self.norm1, self.dropout1)
        self._norm_flags([self.norm1, self.norm2], sequence_parallel, mark_shared_params)

    def forward(
        self,
        hidden_states1: Tensor,
        hidden_states2: Tensor | None = None,
        residual: Tensor | None = None,
        mixer_kwargs: dict[str, Any] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        summed = self.dropout1(hidden_states1)
        if hidden_states2 is not None:
            summed = summed + self.dropout2(hidden_states2)
        if residual is not None:
            summed = residual + summed
        hidden1 = _normed(self.norm1, summed)
        hidden2 = hidden1 if self.norm2 is None else _normed(self.norm2, summed)
        residual = summed.float() if self.residual_in_fp32 else summed
        out1 = self.mixer(hidden1, **(mixer_kwargs or {}))
        out2 = hidden2 if isinstance(self.mlp, nn.Identity) else self.mlp(hidden2)
        return out1, out2, residual


NAMES = ("Block", "ParallelBlock")
