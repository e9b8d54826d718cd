"""flash-attn 2.8.3's private backward functions (`_flash_attn_backward`, its varlen form, the `_wrapped_*`
ops and the extension's `bwd` / `varlen_bwd`) on the stand-in, argument by argument: each one takes the
`out` and `softmax_lse` it is given, not its own (ring and zigzag attention pass the merged ones of every
key block), and every argument flash-attn's takes (flash_attn_2_8_3.SIGNATURES) changes the result as
flash-attn's formula says (reference.sequence_backward), or is documented as having no effect on the
values (deterministic, zero_tensors, rng_state without dropout). dropout_p with the rng_state of its
forward: test_private_forward.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from flash_attn_2_8_3 import SIGNATURES
from private_options import CHANGED, F64, HK, SHARED_DEFAULTS, SK, SQ, B, D, H
from reference import padded_attention, sequence_backward

pytestmark = [
    pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning"),
    pytest.mark.usefixtures("stand_in"),
]

# The options each case sets (flash-attn's positional names); the others keep DEFAULTS.
DEFAULTS: dict[str, Any] = {**SHARED_DEFAULTS, "deterministic": False, "rng_state": None}
# Options that flash-attn takes and that do not change the values fa computes (what docs/using.md says).
NO_EFFECT = {
    "deterministic": {"deterministic": True},
    "rng_state": {"rng_state": torch.zeros(2, dtype=torch.int64)},
}


def _tensors(seed: int, total: bool = False) -> dict[str, torch.Tensor]:
    """Inputs, and an out / softmax_lse that are not the call's own (as a ring step gets them)."""
    g = torch.Generator().manual_seed(seed)
    shape_q, shape_k = ((B * SQ, H, D), (B * SK, HK, D)) if total else ((B, SQ, H, D), (B, SK, HK, D))
    lse_shape = (H, B * SQ) if total else (B, H, SQ)
    return {
        "dout": torch.randn(shape_q, generator=g, dtype=F64),
        "q": torch.randn(shape_q, generator=g, dtype=F64),
        "k": torch.randn(shape_k, generator=g, dtype=F64),
        "v": torch.randn(shape_k, generator=g, dtype=F64),
        "out": torch.randn(shape_q, generator=g, dtype=F64),
        "softmax_lse": (torch.rand(lse_shape, generator=g, dtype=torch.float32) + 2.0),
    }


def _reference(t: dict[str, torch.Tensor], options: dict[str, Any], b: int, rows_q: slice, rows_k: slice):
    causal = options["causal"]
    window = (options["window_size_left"], options["window_size_right"])
    lse = t["softmax_lse"][:, rows_q] if t["softmax_lse"].dim() == 2 else t["softmax_lse"][b]
    return sequence_backward(
        *(t[name][rows_q] if t[name].dim() == 3 else t[name][b][rows_q] for name in ("dout", "q")),
        *(t[name][rows_k] if t[name].dim() == 3 else t[name][b][rows_k] for name in ("k", "v")),
        t["out"][rows_q] if t["out"].dim() == 3 else t["out"][b][rows_q],
        lse,
        causal=causal,
        window=window,
        scale=options["softmax_scale"],
        softcap=options["softcap"],
        slopes=options["alibi_slopes"],
    )


def _padded(backward: str, t: dict[str, torch.Tensor], options: dict[str, Any]) -> list[torch.Tensor]:
    """dq, dk, dv written into the caller's tensors by the named private backward."""
    import flash_attn.flash_attn_interface as fi

    grads = [torch.full_like(t[name], float("nan")) for name in ("q", "k", "v")]
    o = options
    args = [
        t["dout"], t["q"], t["k"], t["v"], t["out"], t["softmax_lse"], *grads, o["dropout_p"],
        o["softmax_scale"], o["causal"], o["window_size_left"], o["window_size_right"], o["softcap"],
        o["alibi_slopes"], o["deterministic"],
    ]  # fmt: skip
    if backward == "flash_attn_gpu.bwd":
        returned = fi.flash_attn_gpu.bwd(*args[:9], args[15], *args[9:15], args[16], None, o["rng_state"])
        assert all(r is g for r, g in zip(returned[:3], grads, strict=True))
    else:
        getattr(fi, backward)(*args, o["rng_state"])
    return grads


def _varlen(
    backward: str, t: dict[str, torch.Tensor], options: dict[str, Any], cu_q, cu_k
) -> list[torch.Tensor]:
    import flash_attn.flash_attn_interface as fi

    grads = [torch.full_like(t[name], float("nan")) for name in ("q", "k", "v")]
    o = options
    lengths = (int(cu_q.diff().max()), int(cu_k.diff().max()))
    head = [t["dout"], t["q"], t["k"], t["v"], t["out"], t["softmax_lse"], *grads]
    scalars = [o["softmax_scale"], o["causal"], o["window_size_left"], o["window_size_right"], o["softcap"]]
    if backward == "flash_attn_gpu.varlen_bwd":
        fi.flash_attn_gpu.varlen_bwd(
            *head, cu_q, cu_k, o["alibi_slopes"], *lengths, o["dropout_p"], o["softmax_scale"], False,
            *scalars[1:], o["deterministic"], None, o["rng_state"],
        )  # fmt: skip
    else:
        getattr(fi, backward)(
            *head, cu_q, cu_k, *lengths, o["dropout_p"], *scalars, o["alibi_slopes"], o["deterministic"],
            o["rng_state"],
        )  # fmt: skip
    return grads


PADDED = ("_flash_attn_backward", "_wrapped_flash_attn_backward", "flash_attn_gpu.bwd")
VARLEN = ("_flash_attn_varlen_backward", "_wrapped_flash_attn_varlen_backward", "flash_attn_gpu.varlen_bwd")


def _check(got: list[torch.Tensor], want: list[torch.Tensor], what: str, tol: float = 1e-9) -> None:
    for name, ours, ref in zip(("dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(ours, ref, rtol=tol, atol=tol, msg=lambda m, n=name: f"{what} {n}: {m}")


def _padded_reference(t: dict[str, torch.Tensor], options: dict[str, Any]) -> list[torch.Tensor]:
    per = [_reference(t, options, b, slice(None), slice(None)) for b in range(B)]
    return [torch.stack([p[i] for p in per]) for i in range(3)]


def test_every_backward_option_has_a_case() -> None:
    """A backward argument of flash-attn's without a case here fails this test (so none goes untested)."""
    names = [n for n, _ in SIGNATURES["flash_attn.flash_attn_interface"]["_flash_attn_backward"]]
    options = names[9:]
    assert set(options) == set(CHANGED) | set(NO_EFFECT) | {"dropout_p"}
    varlen = [n for n, _ in SIGNATURES["flash_attn.flash_attn_interface"]["_flash_attn_varlen_backward"]]
    assert set(varlen) - set(names) == {
        "cu_seqlens_q",
        "cu_seqlens_k",
        "max_seqlen_q",
        "max_seqlen_k",
        "zero_tensors",
    }


@pytest.mark.parametrize("backward", PADDED)
@pytest.mark.parametrize("option", ["defaults", *CHANGED])
def test_padded_backward_honours_out_lse_and_each_option(backward: str, option: str) -> None:
    t = _tensors(1)
    options = {**DEFAULTS, **CHANGED.get(option, {})}
    got = _padded(backward, t, options)
    _check(got, _padded_reference(t, options), f"{backward} {option}")
    if option != "defaults":  # the option matters: the defaults' gradients differ
        assert not torch.allclose(got[0], _padded(backward, t, DEFAULTS)[0])


@pytest.mark.parametrize("backward", PADDED)
@pytest.mark.parametrize("option", NO_EFFECT)
def test_padded_backward_options_without_effect_leave_the_values(backward: str, option: str) -> None:
    t = _tensors(2)
    _check(_padded(backward, t, {**DEFAULTS, **NO_EFFECT[option]}), _padded(backward, t, DEFAULTS), option)


CU_Q = torch.tensor([0, 4, 10], dtype=torch.int32)  # lengths 4 and 6 of the 10 packed query rows
CU_K = torch.tensor([0, 9, 14], dtype=torch.int32)  # 9 and 5 of the 14 key rows


@pytest.mark.parametrize("backward", VARLEN)
@pytest.mark.parametrize("option", ["defaults", *CHANGED])
def test_varlen_backward_honours_out_lse_and_each_option(backward: str, option: str) -> None:
    t = _tensors(3, total=True)
    options = {**DEFAULTS, **CHANGED.get(option, {})}
    got = _varlen(backward, t, options, CU_Q, CU_K)
    want: list[list[torch.Tensor]] = [[], [], []]
    for b in range(2):
        rows_q = slice(int(CU_Q[b]), int(CU_Q[b + 1]))
        rows_k = slice(int(CU_K[b]), int(CU_K[b + 1]))
        for i, grad in enumerate(_reference(t, options, b, rows_q, rows_k)):
            want[i].append(grad)
    _check(got, [torch.cat(w) for w in want], f"{backward} {option}")


def _merge(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ring attention's merge of per-block (out (b, s, h, d), lse (b, h, s)): lse = logsumexp of the blocks',
    out = sum of each block's out weighted by exp(lse_block - lse)."""
    lse = torch.logsumexp(torch.stack(lses), dim=0)
    out = sum(o * torch.exp(l - lse).transpose(1, 2).unsqueeze(-1) for o, l in zip(outs, lses, strict=True))
    return out, lse


@pytest.mark.parametrize("backward", PADDED)
def test_ring_attention_gradients_are_full_attentions(backward: str) -> None:
    """Keys in two blocks, as two ranks of ring-flash-attn hold them: each block's forward, the merged out
    and lse, then each block's backward with the merged ones; dq summed and dk, dv per block are full
    attention's gradients (ring_flash_attn's ring_flash_attn_backward does exactly this)."""
    import flash_attn.flash_attn_interface as fi

    g = torch.Generator().manual_seed(5)
    q, k, v, dout = (torch.randn(B, 6, H, D, generator=g, dtype=F64) for _ in range(4))
    k, v = k[:, :, :HK], v[:, :, :HK]
    blocks = (slice(0, 3), slice(3, 6))
    fwd = [
        fi._flash_attn_forward(q, k[:, s], v[:, s], 0.0, 0.3, False, -1, -1, 0.0, None, False) for s in blocks
    ]
    out, lse = _merge([f[0] for f in fwd], [f[1] for f in fwd])
    full_out, full_lse = padded_attention(q, k, v, scale=0.3)
    torch.testing.assert_close(out, full_out)
    torch.testing.assert_close(lse, full_lse.float(), check_dtype=False)
    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for s in blocks:
        t = {"dout": dout, "q": q, "k": k[:, s], "v": v[:, s], "out": out, "softmax_lse": lse.float()}
        block_dq, block_dk, block_dv = _padded(backward, t, DEFAULTS)
        dq += block_dq
        dk[:, s], dv[:, s] = block_dk, block_dv
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out, _ = padded_attention(*leaves, scale=0.3)
    want = torch.autograd.grad(ref_out, leaves, dout)
    _check([dq, dk, dv], list(want), f"ring {backward}", tol=1e-5)  # the lse is fp32, as flash-attn's
