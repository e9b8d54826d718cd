"""The stand-in's tensor-parallel layers (flash_attn.modules.mlp, flash_attn.ops.fused_dense,
flash_attn.modules.mha.ParallelMHA) and
collectives (flash_attn.utils.distributed) on two real gloo ranks (127.0.0.1), float64: each parallel MLP,
its weights the rank's shard of one unsharded MLP, against that MLP computed on the whole input by the
formula (outputs, and the gradients of the input and of every shard), with sequence_parallel (tokens split
over the ranks) and without (replicated).

    python tp_ranks.py PORT  ->  one line per case: "CASE <name> <max |out err|> <max |grad err|>"
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

WORLD = 2
D, H, TOKENS = 6, 8, 4  # in/out features, hidden features, tokens (a multiple of WORLD)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))


def shard_rows(hidden: int, rank: int) -> slice:
    share = hidden // WORLD
    return slice(rank * share, (rank + 1) * share)


def mlp_case(name: str, sp: bool, rank: int) -> tuple[float, float]:
    from flash_attn.modules.mlp import ParallelGatedMlp, ParallelMLP
    from flash_attn.ops.fused_dense import ParallelFusedMLP

    g = torch.Generator().manual_seed(7)  # the same full tensors on every rank
    gated = name == "ParallelGatedMlp"
    w1 = torch.randn(2 * H if gated else H, D, generator=g, dtype=torch.float64)
    b1 = torch.randn(w1.shape[0], generator=g, dtype=torch.float64)
    w2 = torch.randn(D, H, generator=g, dtype=torch.float64)
    b2 = torch.randn(D, generator=g, dtype=torch.float64)
    x = torch.randn(TOKENS, D, generator=g, dtype=torch.float64)
    dout = torch.randn(TOKENS, D, generator=g, dtype=torch.float64)
    kw = {"sequence_parallel": sp, "dtype": torch.float64}
    if name == "ParallelMLP":
        layer = ParallelMLP(D, H, D, activation=F.gelu, process_group=dist.group.WORLD, **kw)
    elif name == "ParallelFusedMLP":
        layer = ParallelFusedMLP(D, H, D, process_group=dist.group.WORLD, **kw)
    else:
        layer = ParallelGatedMlp(D, dist.group.WORLD, H, D, activation=F.silu, multiple_of=1, **kw)
    rows = shard_rows(H, rank)
    local_w1 = torch.cat([w1[rows], w1[H:][rows]]) if gated else w1[rows]
    local_b1 = torch.cat([b1[rows], b1[H:][rows]]) if gated else b1[rows]
    with torch.no_grad():
        layer.fc1.weight.copy_(local_w1)
        layer.fc1.bias.copy_(local_b1)
        layer.fc2.weight.copy_(w2[:, rows])
        if rank == 0:
            layer.fc2.bias.copy_(b2)
    assert (layer.fc2.bias is not None) == (rank == 0)  # the row-parallel bias lives on rank 0 only
    tokens = shard_rows(TOKENS, rank) if sp else slice(None)
    local_x = x[tokens].clone().requires_grad_()
    out = layer(local_x)
    out.backward(dout[tokens])
    # the unsharded MLP, by the formula
    leaves = [t.clone().requires_grad_() for t in (x, w1, b1, w2, b2)]
    fx, fw1, fb1, fw2, fb2 = leaves
    h = fx @ fw1.T + fb1
    if gated:
        value, gate = h[:, :H], h[:, H:]
        h = value * F.silu(gate)
    else:
        h = F.gelu(h) if name == "ParallelMLP" else gelu_tanh(h)
    ref = h @ fw2.T + fb2
    ref.backward(dout)
    ref_w1 = torch.cat([fw1.grad[rows], fw1.grad[H:][rows]]) if gated else fw1.grad[rows]
    ref_b1 = torch.cat([fb1.grad[rows], fb1.grad[H:][rows]]) if gated else fb1.grad[rows]
    pairs = [
        (local_x.grad, fx.grad[tokens]),
        (layer.fc1.weight.grad, ref_w1),
        (layer.fc1.bias.grad, ref_b1),
        (layer.fc2.weight.grad, fw2.grad[:, rows]),
    ]
    if rank == 0:
        pairs.append((layer.fc2.bias.grad, fb2.grad))
    out_err = (out - ref[tokens]).abs().max().item()
    grad_err = max((a - b).abs().max().item() for a, b in pairs)
    return out_err, grad_err


def mha_case(sp: bool, rank: int) -> tuple[float, float]:
    """ParallelMHA (GQA: 4 query heads, 2 kv heads, causal) against the attention formula on the
    unsharded weights: rank r holds query heads 2r, 2r+1 and kv head r."""
    from flash_attn.modules.mha import ParallelMHA

    heads, heads_kv, dim, batch, seqlen = 4, 2, 3, 2, 4
    embed = heads * dim
    g = torch.Generator().manual_seed(9)
    w_qkv = torch.randn(dim * (heads + 2 * heads_kv), embed, generator=g, dtype=torch.float64)
    b_qkv = torch.randn(w_qkv.shape[0], generator=g, dtype=torch.float64)
    w_out = torch.randn(embed, embed, generator=g, dtype=torch.float64)
    b_out = torch.randn(embed, generator=g, dtype=torch.float64)
    x = torch.randn(batch, seqlen, embed, generator=g, dtype=torch.float64)
    dout = torch.randn(batch, seqlen, embed, generator=g, dtype=torch.float64)
    layer = ParallelMHA(
        embed, heads, dist.group.WORLD, num_heads_kv=heads_kv, causal=True, sequence_parallel=sp,
        dtype=torch.float64,
    )  # fmt: skip
    q_rows = slice(2 * rank * dim, (2 * rank + 2) * dim)
    k_rows = slice(heads * dim + rank * dim, heads * dim + (rank + 1) * dim)
    v_rows = slice((heads + heads_kv) * dim + rank * dim, (heads + heads_kv) * dim + (rank + 1) * dim)

    def local(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[q_rows], t[k_rows], t[v_rows]])

    with torch.no_grad():
        layer.Wqkv.weight.copy_(local(w_qkv))
        layer.Wqkv.bias.copy_(local(b_qkv))
        layer.out_proj.weight.copy_(w_out[:, q_rows])
        if rank == 0:
            layer.out_proj.bias.copy_(b_out)
    if sp:  # this rank's rows of the (batch * seqlen) tokens
        tokens = shard_rows(batch * seqlen, rank)
        local_x = x.flatten(0, 1)[tokens].clone().requires_grad_()
        out = layer(local_x, seqlen=seqlen)
        out.backward(dout.flatten(0, 1)[tokens])
    else:
        local_x = x.clone().requires_grad_()
        out = layer(local_x)
        out.backward(dout)
    leaves = [t.clone().requires_grad_() for t in (x, w_qkv, b_qkv, w_out, b_out)]
    fx, fw, fb, fwo, fbo = leaves
    qkv = fx @ fw.T + fb
    q = qkv[..., : heads * dim].unflatten(-1, (heads, dim))
    k = qkv[..., heads * dim : (heads + heads_kv) * dim].unflatten(-1, (heads_kv, dim))
    v = qkv[..., (heads + heads_kv) * dim :].unflatten(-1, (heads_kv, dim))
    k, v = (t.repeat_interleave(heads // heads_kv, dim=2) for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / dim**0.5
    later = torch.arange(seqlen)[None, :] > torch.arange(seqlen)[:, None]
    probs = scores.masked_fill(later, float("-inf")).softmax(-1)
    ref = torch.einsum("bhqk,bkhd->bqhd", probs, v).flatten(-2) @ fwo.T + fbo
    ref.backward(dout)
    want_out = ref.flatten(0, 1)[tokens] if sp else ref
    want_x = fx.grad.flatten(0, 1)[tokens] if sp else fx.grad
    pairs = [
        (local_x.grad, want_x),
        (layer.Wqkv.weight.grad, local(fw.grad)),
        (layer.Wqkv.bias.grad, local(fb.grad)),
        (layer.out_proj.weight.grad, fwo.grad[:, q_rows]),
    ]
    if rank == 0:
        pairs.append((layer.out_proj.bias.grad, fbo.grad))
    return (out - want_out).abs().max().item(), max((a - b).abs().max().item() for a, b in pairs)


def embedding_case(sp: bool, rank: int) -> tuple[float, float]:
    """ParallelGPT2Embeddings (vocabulary rows and position columns sharded) against the full tables:
    with sequence_parallel its (batch * seqlen) rows are split over the ranks, else every rank has all."""
    from flash_attn.modules.embedding import ParallelGPT2Embeddings

    vocab, positions, dim, batch, seqlen = 10, 8, 6, 2, 4
    g = torch.Generator().manual_seed(11)
    words = torch.randn(vocab, dim, generator=g, dtype=torch.float64)
    table = torch.randn(positions, dim, generator=g, dtype=torch.float64)
    ids = torch.randint(0, vocab, (batch, seqlen), generator=g)
    dout = torch.randn(batch * seqlen, dim, generator=g, dtype=torch.float64)
    layer = ParallelGPT2Embeddings(
        dim, vocab, positions, dist.group.WORLD, sequence_parallel=sp, dtype=torch.float64
    )
    rows, cols = shard_rows(vocab, rank), shard_rows(dim, rank)
    with torch.no_grad():
        layer.word_embeddings.weight.copy_(words[rows])
        layer.position_embeddings.weight.copy_(table[:, cols])
    out = layer(ids, combine_batch_seqlen_dim=True)
    tokens = shard_rows(batch * seqlen, rank) if sp else slice(None)
    out.backward(dout[tokens])
    leaves = [t.clone().requires_grad_() for t in (words, table)]
    ref = (leaves[0][ids] + leaves[1][torch.arange(seqlen)]).flatten(0, 1)
    ref.backward(dout)
    pairs = [
        (layer.word_embeddings.weight.grad, leaves[0].grad[rows]),
        (layer.position_embeddings.weight.grad, leaves[1].grad[:, cols]),
    ]
    return (out - ref[tokens]).abs().max().item(), max((a - b).abs().max().item() for a, b in pairs)


def collectives_case(rank: int) -> tuple[float, float]:
    from flash_attn.utils.distributed import all_gather, all_reduce, reduce_scatter

    parts = [torch.arange(6, dtype=torch.float64).reshape(2, 3) + 10 * r for r in range(WORLD)]
    weight = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(4, 3)
    mine = parts[rank].clone().requires_grad_()
    gathered = all_gather(mine, dist.group.WORLD)
    (gathered * weight).sum().backward()
    errors = [(gathered - torch.cat(parts)).abs().max().item()]
    grad_errors = [(mine.grad - WORLD * weight[2 * rank : 2 * rank + 2]).abs().max().item()]
    full = [torch.full((4, 3), float(r + 1), dtype=torch.float64) for r in range(WORLD)]
    mine = full[rank].clone().requires_grad_()
    scattered = reduce_scatter(mine, dist.group.WORLD)
    (scattered * weight[2 * rank : 2 * rank + 2]).sum().backward()
    errors.append((scattered - sum(full)[2 * rank : 2 * rank + 2]).abs().max().item())
    grad_errors.append((mine.grad - weight).abs().max().item())  # every rank's slice, gathered back
    mine = full[rank].clone().requires_grad_()
    summed = all_reduce(mine, dist.group.WORLD)
    (summed * weight).sum().backward()
    errors.append((summed - sum(full)).abs().max().item())
    errors.append((mine.detach() - full[rank]).abs().max().item())  # the input is left as it was
    grad_errors.append((mine.grad - weight).abs().max().item())
    return max(errors), max(grad_errors)


def run(rank: int, port: int) -> None:
    import fa_attn

    fa_attn.install_as_flash_attn()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    cases = {"collectives": lambda: collectives_case(rank)}
    for name in ("ParallelMLP", "ParallelGatedMlp", "ParallelFusedMLP"):
        for sp in (True, False):
            cases[f"{name}-{'sp' if sp else 'nosp'}"] = lambda name=name, sp=sp: mlp_case(name, sp, rank)
    for sp in (True, False):
        cases[f"ParallelMHA-{'sp' if sp else 'nosp'}"] = lambda sp=sp: mha_case(sp, rank)
        cases[f"ParallelGPT2Embeddings-{'sp' if sp else 'nosp'}"] = lambda sp=sp: embedding_case(sp, rank)
    for case, run_case in cases.items():
        errors = torch.tensor(run_case(), dtype=torch.float64)
        dist.all_reduce(errors, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"CASE {case} {errors[0].item():.3e} {errors[1].item():.3e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    mp.spawn(run, args=(int(sys.argv[1]),), nprocs=WORLD, join=True)
