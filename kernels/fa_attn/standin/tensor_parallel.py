"""flash-attn's dense layers and their tensor-parallel forms, in plain torch (torch.nn.functional.linear
and torch.distributed), with flash-attn 2.8.3's names, arguments, parameter shapes and state_dict names,
for the stand-in's flash_attn.utils.distributed, flash_attn.ops.fused_dense and flash_attn.modules.mlp.

What each computes (flash-attn's Megatron-style rules):
  - all_gather / reduce_scatter concatenate / sum-and-split along dim 0 over the process group; each is
    the other's backward. all_reduce sums; its backward passes the gradient through. The *_raw forms
    return (output, handle) and take async_op, without autograd.
  - fused_dense_func(x, weight, bias, return_residual, process_group, sequence_parallel) is
    F.linear(x', weight, bias), x' = all_gather(x) with a group and sequence_parallel, else x; with a
    group, x's gradient is reduce-scattered (sequence_parallel) or all-reduced. return_residual also
    returns x.
  - fused_mlp_func: fc2(act(fc1(x))), act one of "gelu_approx" (tanh GELU), "relu", "sqrelu"; the same
    group rules on fc1's input. save_pre_act / checkpoint_lvl / heuristic choose what flash-attn's CUDA
    kernel keeps for its backward: accepted and checked, no effect on the values.
  - ColumnParallelLinear holds this rank's share of the output features, RowParallelLinear of the input
    features (shares as get_dim_for_local_rank splits them, in units of multiple_of; the row form's bias
    on rank 0 only), and sums its partial outputs (reduce_scatter with sequence_parallel, else all_reduce).
  - Mlp / GatedMlp / ParallelMLP / ParallelGatedMlp (modules.mlp): fc1, activation, fc2; the gated forms
    split fc1's output in (y, gate) halves: y * act(gate), or F.glu for sigmoid.
Where flash-attn needs CUDA (its fused_dense_lib extension), these run on any device and dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..runtime.inputs import InputError
from .activations import sqrelu_fwd

Tensor = torch.Tensor
Group = Any  # torch.distributed.ProcessGroup, or None for the default group


# ---- flash_attn.utils.distributed -------------------------------------------------------------------


def all_gather_raw(input_: Tensor, process_group: Group, async_op: bool = False) -> tuple[Tensor, Any]:
    world_size = dist.get_world_size(process_group)
    output = input_.new_empty(world_size * input_.shape[0], *input_.shape[1:])
    handle = dist.all_gather_into_tensor(output, input_.contiguous(), group=process_group, async_op=async_op)
    return output, handle


def reduce_scatter_raw(input_: Tensor, process_group: Group, async_op: bool = False) -> tuple[Tensor, Any]:
    world_size = dist.get_world_size(process_group)
    if input_.shape[0] % world_size:
        raise InputError(
            f"reduce_scatter: dim 0 ({input_.shape[0]}) must be a multiple of the group's size ({world_size})"
        )
    output = input_.new_empty(input_.shape[0] // world_size, *input_.shape[1:])
    handle = dist.reduce_scatter_tensor(output, input_.contiguous(), group=process_group, async_op=async_op)
    return output, handle


def all_reduce_raw(input_: Tensor, process_group: Group, async_op: bool = False) -> tuple[Tensor, Any]:
    input_ = input_.contiguous()
    handle = dist.all_reduce(input_, group=process_group, async_op=async_op)
    return input_, handle


class AllGatherFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input_: Tensor, process_group: Group) -> Tensor:
        ctx.process_group = process_group
        return all_gather_raw(input_, process_group)[0]

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:
        return reduce_scatter_raw(grad_output, ctx.process_group)[0], None


class ReduceScatterFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input_: Tensor, process_group: Group) -> Tensor:
        ctx.process_group = process_group
        return reduce_scatter_raw(input_, process_group)[0]

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:
        return all_gather_raw(grad_output, ctx.process_group)[0], None


class AllReduceFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input_: Tensor, process_group: Group) -> Tensor:  # noqa: ARG004 (autograd's)
        return all_reduce_raw(input_.clone(), process_group)[0]

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:  # noqa: ARG004 (autograd's)
        return grad_output, None


all_gather = AllGatherFunc.apply
reduce_scatter = ReduceScatterFunc.apply
all_reduce = AllReduceFunc.apply


def _shared(model: nn.Module, flag: str) -> list[Tensor]:
    """The parameters marked `flag` (flash-attn's _shared_params / _sequence_parallel), by name."""
    marked = {name: p for name, p in model.named_parameters() if getattr(p, flag, False)}
    return [marked[name] for name in sorted(marked)]


def sync_shared_params(model: nn.Module, process_group: Group) -> None:
    """Broadcast the parameters marked _shared_params from the group's first rank."""
    source = dist.get_global_rank(process_group, 0) if process_group is not None else 0
    with torch.no_grad():
        for p in _shared(model, "_shared_params"):
            dist.broadcast(p, src=source, group=process_group)


def allreduce_sequence_parallel_grad(model: nn.Module, process_group: Group) -> None:
    """Sum, over the group, the gradients of the parameters marked _sequence_parallel."""
    grads = [p.grad for p in _shared(model, "_sequence_parallel") if p.grad is not None]
    if not grads:
        return
    with torch.no_grad():
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=process_group)
        for grad, summed in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(summed)


def get_dim_for_local_rank(dim: int, world_size: int, local_rank: int, multiple_of: int = 1) -> int:
    """This rank's share of `dim` split over world_size ranks in units of multiple_of (the first
    ranks take one unit more when it does not divide evenly)."""
    units = dim // multiple_of
    return (units // world_size + int(local_rank < units % world_size)) * multiple_of


# ---- flash_attn.ops.fused_dense ---------------------------------------------------------------------


class _GatherInput(torch.autograd.Function):
    """x -> all_gather(x) (sequence_parallel) or x; x's gradient reduce-scattered or all-reduced."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, process_group: Group, sequence_parallel: bool) -> Tensor:
        ctx.process_group, ctx.sequence_parallel = process_group, sequence_parallel
        return all_gather_raw(x, process_group)[0] if sequence_parallel else x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        if ctx.sequence_parallel:
            return reduce_scatter_raw(grad, ctx.process_group)[0], None, None
        return all_reduce_raw(grad.clone(), ctx.process_group)[0], None, None


def _group_input(x: Tensor, process_group: Group, sequence_parallel: bool) -> Tensor:
    if process_group is None:
        return x
    gathered: Tensor = _GatherInput.apply(x, process_group, sequence_parallel)  # type: ignore[no-untyped-call]
    return gathered


def fused_dense_func(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    return_residual: bool = False,
    process_group: Group = None,
    sequence_parallel: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    out = F.linear(_group_input(x, process_group, sequence_parallel), weight, bias)
    return (out, x) if return_residual else out


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_approx": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "sqrelu": sqrelu_fwd,
}


def _activation(name: str) -> Callable[[Tensor], Tensor]:
    if name not in _ACTIVATIONS:
        raise InputError(f"activation: {name!r} is not one of {sorted(_ACTIVATIONS)} (flash-attn's FusedMLP)")
    return _ACTIVATIONS[name]


def _check_mlp_options(checkpoint_lvl: int, heuristic: int | str) -> None:
    if checkpoint_lvl not in (0, 1, 2):
        raise InputError(f"checkpoint_lvl: {checkpoint_lvl!r} is not 0, 1 or 2")
    if heuristic != "auto" and not (isinstance(heuristic, int) and -1 <= heuristic <= 4):
        raise InputError(f"heuristic: {heuristic!r} is not 'auto' or an int in -1..4")


def fused_mlp_func(
    x: Tensor,
    weight1: Tensor,
    weight2: Tensor,
    bias1: Tensor | None = None,
    bias2: Tensor | None = None,
    activation: str = "gelu_approx",
    save_pre_act: bool = True,
    return_residual: bool = False,
    checkpoint_lvl: int = 0,
    heuristic: int = 0,
    process_group: Group = None,
    sequence_parallel: bool = True,
) -> Tensor | tuple[Tensor, Tensor]:
    del save_pre_act  # what flash-attn's kernel keeps for its backward; autograd keeps what it needs
    _check_mlp_options(checkpoint_lvl, heuristic)
    act = _activation(activation)
    hidden = act(F.linear(_group_input(x, process_group, sequence_parallel), weight1, bias1))
    out = F.linear(hidden, weight2, bias2)
    return (out, x) if return_residual else out


class FusedDense(nn.Linear):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        return_residual: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.return_residual = return_residual

    def forward(self, x: Tensor, process_group: Group = None) -> Any:
        return fused_dense_func(x, self.weight, self.bias, self.return_residual, process_group)


def _local_features(features: int, process_group: Group, multiple_of: int, what: str) -> int:
    if features % multiple_of:
        raise InputError(f"{what} ({features}) must be a multiple of multiple_of ({multiple_of})")
    return get_dim_for_local_rank(
        features, dist.get_world_size(process_group), dist.get_rank(process_group), multiple_of
    )


class ColumnParallelLinear(nn.Linear):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        process_group: Group,
        bias: bool = True,
        sequence_parallel: bool = True,
        multiple_of: int = 1,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        local = _local_features(out_features, process_group, multiple_of, "out_features")
        super().__init__(in_features, local, bias=bias, device=device, dtype=dtype)
        self.process_group = process_group
        self.sequence_parallel = sequence_parallel

    def forward(self, x: Tensor) -> Tensor:
        out = fused_dense_func(
            x,
            self.weight,
            self.bias,
            process_group=self.process_group,
            sequence_parallel=self.sequence_parallel,
        )
        return out  # type: ignore[return-value]  # a tensor without return_residual


class RowParallelLinear(nn.Linear):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        process_group: Group,
        bias: bool = True,
        sequence_parallel: bool = True,
        multiple_of: int = 1,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        local = _local_features(in_features, process_group, multiple_of, "in_features")
        first = dist.get_rank(process_group) == 0  # the bias is added once, on the first rank
        super().__init__(local, out_features, bias=bias and first, device=device, dtype=dtype)
        self.process_group = process_group
        self.sequence_parallel = sequence_parallel

    def forward(self, x: Tensor) -> Tensor:
        out = F.linear(x, self.weight, self.bias)
        combine = reduce_scatter if self.sequence_parallel else all_reduce
        combined: Tensor = combine(out, self.process_group)  # type: ignore[no-untyped-call]
        return combined


def _linears(
    sizes: tuple[int, int, int], biases: tuple[bool, bool], factory: dict[str, Any], gated: bool = False,
    group: Group = None, sequence_parallel: bool | None = None,
) -> tuple[nn.Linear, nn.Linear]:  # fmt: skip
    """fc1 (in -> hidden, twice hidden when gated) and fc2 (hidden -> out); the column- and row-parallel
    forms over `group` when sequence_parallel is given (True or False)."""
    in_features, hidden, out_features = sizes
    width = 2 * hidden if gated else hidden
    if sequence_parallel is None:
        return (
            nn.Linear(in_features, width, bias=biases[0], **factory),
            nn.Linear(hidden, out_features, bias=biases[1], **factory),
        )
    return (
        ColumnParallelLinear(in_features, width, group, biases[0], sequence_parallel, **factory),
        RowParallelLinear(hidden, out_features, group, biases[1], sequence_parallel, **factory),
    )


class FusedMLP(nn.Module):
    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        bias1: bool = True,
        bias2: bool = True,
        activation: str = "gelu_approx",
        return_residual: bool = False,
        checkpoint_lvl: int = 0,
        heuristic: int | str = "auto",
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        _activation(activation)
        _check_mlp_options(checkpoint_lvl, heuristic)
        self.activation = activation
        self.return_residual = return_residual
        self.checkpoint_lvl = checkpoint_lvl
        self.heuristic = heuristic
        sizes = (in_features, hidden_features or in_features * 4, out_features or in_features)
        self.fc1, self.fc2 = _linears(sizes, (bias1, bias2), {"device": device, "dtype": dtype})

    def forward(self, x: Tensor, process_group: Group = None) -> Any:
        return fused_mlp_func(
            x, self.fc1.weight, self.fc2.weight, self.fc1.bias, self.fc2.bias, self.activation,
            return_residual=self.return_residual, checkpoint_lvl=self.checkpoint_lvl,
            process_group=process_group,
        )  # fmt: skip


class ParallelFusedMLP(nn.Module):
    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        activation: str = "gelu_approx",
        process_group: Group = None,
        bias1: bool = True,
        bias2: bool = True,
        sequence_parallel: bool = True,
        checkpoint_lvl: int = 0,
        heuristic: int | str = "auto",
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if process_group is None:
            raise InputError("process_group: ParallelFusedMLP needs one (flash-attn asserts it too)")
        _check_mlp_options(checkpoint_lvl, heuristic)
        self.act = _activation(activation)
        self.activation = activation
        self.process_group = process_group
        self.sequence_parallel = sequence_parallel
        self.checkpoint_lvl = checkpoint_lvl
        self.heuristic = heuristic
        sizes = (in_features, hidden_features or in_features * 4, out_features or in_features)
        factory = {"device": device, "dtype": dtype}
        self.fc1, self.fc2 = _linears(sizes, (bias1, bias2), factory, False, process_group, sequence_parallel)

    def forward(self, x: Tensor) -> Any:
        return self.fc2(self.act(self.fc1(x)))


# ---- flash_attn.modules.mlp -------------------------------------------------------------------------


class Mlp(nn.Module):
    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        activation: Callable[[Tensor], Tensor] = F.gelu,
        bias1: bool = True,
        bias2: bool = True,
        return_residual: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.return_residual = return_residual
        self.activation = activation
        sizes = _mlp_sizes(in_features, hidden_features, out_features)
        self.fc1, self.fc2 = _linears(sizes, (bias1, bias2), {"device": device, "dtype": dtype})

    def forward(self, x: Tensor) -> Any:
        y = self.fc2(self.activation(self.fc1(x)))
        return (y, x) if self.return_residual else y


class ParallelMLP(nn.Module):
    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        activation: Callable[[Tensor], Tensor] = F.gelu,
        process_group: Group = None,
        sequence_parallel: bool = True,
        bias1: bool = True,
        bias2: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.activation = activation
        sizes = _mlp_sizes(in_features, hidden_features, out_features)
        factory = {"device": device, "dtype": dtype}
        self.fc1, self.fc2 = _linears(sizes, (bias1, bias2), factory, False, process_group, sequence_parallel)

    def forward(self, x: Tensor) -> Any:
        return self.fc2(self.activation(self.fc1(x)))


def _mlp_sizes(in_features: int, hidden: int | None, out: int | None) -> tuple[int, int, int]:
    """(in, hidden, out): hidden defaults to 4 * in, out to in (modules.mlp's rule)."""
    return in_features, in_features * 4 if hidden is None else hidden, in_features if out is None else out


def _gated_sizes(
    in_features: int, hidden: int | None, out: int | None, multiple_of: int
) -> tuple[int, int, int]:
    """The gated MLPs' sizes: hidden defaults to 8/3 of in, rounded up to a multiple of multiple_of."""
    width = hidden if hidden is not None else int(8 * in_features / 3)
    return (
        in_features,
        (width + multiple_of - 1) // multiple_of * multiple_of,
        in_features if out is None else out,
    )


def _gate(y: Tensor, activation: Callable[[Tensor], Tensor]) -> Tensor:
    if activation is F.sigmoid or activation is torch.sigmoid:
        return F.glu(y, dim=-1)
    value, gate = y.chunk(2, dim=-1)
    return value * activation(gate)


class GatedMlp(nn.Module):
    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        activation: Callable[[Tensor], Tensor] = F.sigmoid,
        bias1: bool = True,
        bias2: bool = True,
        multiple_of: int = 256,
        return_residual: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.return_residual = return_residual
        self.activation = activation
        sizes = _gated_sizes(in_features, hidden_features, out_features, multiple_of)
        self.fc1, self.fc2 = _linears(sizes, (bias1, bias2), {"device": device, "dtype": dtype}, gated=True)

    def forward(self, x: Tensor) -> Any:
        y = self.fc2(_gate(self.fc1(x), self.activation))
        return (y, x) if self.return_residual else y


class ParallelGatedMlp(nn.Module):
    def __init__(
        self,
        in_features: int,
        process_group: Group,
        hidden_features: int | None = None,
        out_features: int | None = None,
        activation: Callable[[Tensor], Tensor] = F.sigmoid,
        bias1: bool = True,
        bias2: bool = True,
        multiple_of: int = 256,
        sequence_parallel: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.activation = activation
        sizes = _gated_sizes(in_features, hidden_features, out_features, multiple_of)
        factory = {"device": device, "dtype": dtype}
        self.fc1, self.fc2 = _linears(sizes, (bias1, bias2), factory, True, process_group, sequence_parallel)

    def forward(self, x: Tensor) -> Any:
        return self.fc2(_gate(self.fc1(x), self.activation))


DISTRIBUTED_NAMES = (
    "all_gather_raw", "reduce_scatter_raw", "all_reduce_raw", "AllGatherFunc", "ReduceScatterFunc",
    "AllReduceFunc", "all_gather", "reduce_scatter", "all_reduce", "sync_shared_params",
    "allreduce_sequence_parallel_grad", "get_dim_for_local_rank",
)  # fmt: skip
FUSED_DENSE_NAMES = (
    "fused_dense_func", "fused_mlp_func", "FusedDense", "ColumnParallelLinear", "RowParallelLinear",
    "FusedMLP", "ParallelFusedMLP",
)  # fmt: skip
MLP_NAMES = ("Mlp", "ParallelMLP", "GatedMlp", "ParallelGatedMlp", "FusedMLP", "ParallelFusedMLP")
