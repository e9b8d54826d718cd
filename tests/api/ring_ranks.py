"""Real ring-flash-attn on the flash_attn stand-in: two gloo ranks on the CPU (127.0.0.1), each holding
its slice of the sequence; ring (contiguous slices; causal and not) and zigzag (chunks i and 2*world-1-i; causal only, as it
requires) attention, outputs and gradients of q, k, v (bf16) against torch SDPA's math on the whole sequence in float64.

    python ring_ranks.py PORT  ->  one line per case: "CASE <name> <max |out err|> <max |grad err|>"

ring_flash_attn's package __init__ imports its transformers adapter, which names a function transformers
5 no longer has; the ring functions themselves are imported from their modules, with the package's
__init__ not run (its own code, unchanged)."""

from __future__ import annotations

import importlib.util
import sys
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

WORLD = 2


def ring_modules() -> tuple[object, object]:
    spec = importlib.util.find_spec("ring_flash_attn")
    assert spec is not None, "ring-flash-attn is not installed (pip install -e '.[test]')"
    package = types.ModuleType("ring_flash_attn")
    package.__path__ = list(spec.submodule_search_locations or [])
    sys.modules["ring_flash_attn"] = package
    ring = importlib.import_module("ring_flash_attn.ring_flash_attn")
    zigzag = importlib.import_module("ring_flash_attn.zigzag_ring_flash_attn")
    return ring.ring_flash_attn_func, zigzag.zigzag_ring_flash_attn_func


def slices(kind: str, seqlen: int, rank: int) -> torch.Tensor:
    """The sequence positions rank holds."""
    if kind == "ring":
        part = seqlen // WORLD
        return torch.arange(rank * part, (rank + 1) * part)
    chunk = seqlen // (2 * WORLD)
    first, second = rank, 2 * WORLD - 1 - rank
    return torch.cat(
        [torch.arange(first * chunk, (first + 1) * chunk), torch.arange(second * chunk, (second + 1) * chunk)]
    )


def run(rank: int, port: int) -> None:
    import fa_attn

    fa_attn.install_as_flash_attn()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    ring_func, zigzag_func = ring_modules()
    g = torch.Generator().manual_seed(0)  # the same full tensors on every rank
    batch, seqlen, heads, dim = 2, 16, 4, 8
    # bf16, the dtype ring-flash-attn is written for (its backward returns dq in bf16, and with fp32 its
    # .to(torch.float32) would alias the block buffers it reuses)
    q, k, v, dout = (torch.randn(batch, seqlen, heads, dim, generator=g).bfloat16() for _ in range(4))
    cases = (("ring", ring_func, False), ("ring", ring_func, True), ("zigzag", zigzag_func, True))
    for kind, func, causal in cases:  # zigzag is causal only (its own assertion)
        rows = slices(kind, seqlen, rank)
        local = [t[:, rows].clone().requires_grad_() for t in (q, k, v)]
        out = func(*local, softmax_scale=0.3, causal=causal)
        out.backward(dout[:, rows])
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in leaves), is_causal=causal, scale=0.3
        ).transpose(1, 2)
        ref.backward(dout.double())
        out_err = (out.double() - ref[:, rows]).abs().max().item()
        grad_err = max(
            (t.grad.double() - r.grad[:, rows]).abs().max().item() for t, r in zip(local, leaves, strict=True)
        )
        errors = torch.tensor([out_err, grad_err], dtype=torch.float64)
        dist.all_reduce(errors, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(
                f"CASE {kind}-{'causal' if causal else 'full'} {errors[0].item():.3e} {errors[1].item():.3e}"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    mp.spawn(run, args=(int(sys.argv[1]),), nprocs=WORLD, join=True)
