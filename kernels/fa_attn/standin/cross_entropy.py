"""flash-attn's CrossEntropyLoss (flash_attn.losses.cross_entropy), in plain torch with its arguments and
results, for the stand-in.

Per row, with logits scaled by logit_scale and lse their logsumexp (or precomputed_lse): the loss is
lse - logit[target], or with label_smoothing s, lse - s * mean(logits) - (1 - s) * logit[target]; the
z-loss lse_square_scale * lse^2 is added to it; rows whose target is ignore_index give 0. "mean" divides
the sum by the rows not ignored (flash-attn's rule, not torch's weighted mean). Losses are fp32.
return_z_loss=True also returns the z-loss part (detached, for logging, as flash-attn's). With
precomputed_lse, the gradient is flash-attn's: the logits' softmax comes from that lse, and the lse
tensor itself gets no gradient. Not provided:
process_group (tensor-parallel vocab shards): it raises; inplace_backward is accepted and has no effect.
cross_entropy_loss (flash_attn.ops.triton.cross_entropy's function) returns (losses, z_losses) per row.
"""

from __future__ import annotations

import torch

from ..runtime.inputs import InputError

Tensor = torch.Tensor


class CrossEntropyLoss(torch.nn.Module):
    def __init__(
        self,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        logit_scale: float = 1.0,
        lse_square_scale: float = 0.0,
        inplace_backward: bool = False,
        process_group: object = None,
        return_z_loss: bool = False,
    ) -> None:
        super().__init__()
        if reduction not in ("mean", "none", "sum"):
            raise NotImplementedError("Only support reduction = 'mean' or 'none' or 'sum'")
        if process_group is not None:
            raise InputError(
                "process_group: fa_attn's CrossEntropyLoss does not shard the vocabulary across processes; "
                "gather the logits (torch.distributed) and pass process_group=None"
            )
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.logit_scale = logit_scale
        self.lse_square_scale = lse_square_scale
        self.inplace_backward = inplace_backward
        self.process_group = process_group
        self.return_z_loss = return_z_loss

    def forward(
        self, input: Tensor, target: Tensor, precomputed_lse: Tensor | None = None
    ) -> Tensor | tuple[Tensor, Tensor]:
        """input (batch, vocab), target (batch,) -> losses (batch,) with reduction "none", else a scalar."""
        logits = input.float() * self.logit_scale
        lse = (
            torch.logsumexp(logits, dim=-1)
            if precomputed_lse is None
            else _given_lse(logits, precomputed_lse)
        )
        ignored = target == self.ignore_index
        in_range = (target >= 0) & (target < logits.shape[-1]) & ~ignored
        picked = logits.gather(-1, torch.where(in_range, target, 0).unsqueeze(-1)).squeeze(-1)
        smoothing = self.label_smoothing
        # An out-of-range target keeps only the smoothing part of its loss (flash-attn's kernel).
        label_part = torch.where(in_range, lse - picked, torch.zeros_like(lse))
        if smoothing > 0:
            loss = (1 - smoothing) * label_part + smoothing * (lse - logits.mean(-1))
        else:
            loss = label_part
        z_loss = self.lse_square_scale * lse.square()
        loss = torch.where(ignored, torch.zeros_like(loss), loss + z_loss)
        z_loss = torch.where(ignored, torch.zeros_like(z_loss), z_loss).detach()
        loss, z_loss = self._reduce(loss, ignored), self._reduce(z_loss, ignored)
        return (loss, z_loss) if self.return_z_loss else loss

    def _reduce(self, values: Tensor, ignored: Tensor) -> Tensor:
        if self.reduction == "mean":
            return values.sum() / (~ignored).sum()
        if self.reduction == "sum":
            return values.sum()
        return values


def _given_lse(logits: Tensor, precomputed_lse: Tensor) -> Tensor:
    """precomputed_lse's values, differentiated as flash-attn's backward does: the logits get the softmax
    exp(logit - lse) taken from the given lse (as if it were their logsumexp), and the lse tensor gets no
    gradient (its backward returns None for it). The added term is zero in value."""
    lse = precomputed_lse.detach().float()
    softmax_sum = torch.exp(logits - lse.unsqueeze(-1)).sum(-1)
    return lse + (softmax_sum - softmax_sum.detach())


def cross_entropy_loss(
    logits: Tensor,
    labels: Tensor,
    precomputed_lse: Tensor | None = None,
    label_smoothing: float = 0.0,
    logit_scale: float = 1.0,
    lse_square_scale: float = 0.0,
    ignore_index: int = -100,
    inplace_backward: bool = False,
    process_group: object = None,
) -> tuple[Tensor, Tensor]:
    """flash_attn.ops.triton.cross_entropy's function: (losses, z_losses), each (batch,) fp32, per row
    as CrossEntropyLoss with reduction="none" computes them (z_losses detached, for logging)."""
    loss = CrossEntropyLoss(
        ignore_index=ignore_index,
        reduction="none",
        label_smoothing=label_smoothing,
        logit_scale=logit_scale,
        lse_square_scale=lse_square_scale,
        inplace_backward=inplace_backward,
        process_group=process_group,
        return_z_loss=True,
    )
    losses, z_losses = loss(logits, labels, precomputed_lse)
    return losses, z_losses
