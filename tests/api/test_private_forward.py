"""flash-attn 2.8.3's private forwards (`_flash_attn_forward`, `_flash_attn_varlen_forward`, the `_wrapped_*`
ops, the extension's `fwd` / `varlen_fwd`) on the stand-in, argument by argument against the float64
reference (reference.py), and dropout end to end: the forward's rng_state replays its mask in the
caller-driven backward (`_flash_attn_backward(..., rng_state)`), as ring attention and diffusers' context
parallelism drive it; S_dmask (return_softmax) carries the probabilities, negated where dropped."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from flash_attn_2_8_3 import SIGNATURES
from private_options import CHANGED, F64, HK, SHARED_DEFAULTS, SK, SQ, B, D, H
from reference import flash_attn_lse, sequence_attention

pytestmark = [
    pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning"),
    pytest.mark.usefixtures("stand_in"),
]

DEFAULTS: dict[str, Any] = {**SHARED_DEFAULTS, "return_softmax": False}
PADDED = ("_flash_attn_forward", "_wrapped_flash_attn_forward", "flash_attn_gpu.fwd")
VARLEN = ("_flash_attn_varlen_forward", "_wrapped_flash_attn_varlen_forward", "flash_attn_gpu.varlen_fwd")
CU_Q = torch.tensor([0, 4, 10], dtype=torch.int32)
CU_K = torch.tensor([0, 9, 14], dtype=torch.int32)
MAX_Q, MAX_K = 6, 9


def qkv(seed: int, total: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if total:
        shapes = ((int(CU_Q[-1]), H, D), (int(CU_K[-1]), HK, D))
    else:
        shapes = ((B, SQ, H, D), (B, SK, HK, D))
    return tuple(torch.randn(shapes[i > 0], generator=g, dtype=F64) for i in range(3))  # type: ignore[return-value]


def forward(
    name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: dict[str, Any]
) -> list[torch.Tensor]:
    """(out, softmax_lse, S_dmask, rng_state) from the named private forward, positional as callers pass."""
    import flash_attn.flash_attn_interface as fi

    window = (o["window_size_left"], o["window_size_right"])
    if name in PADDED:
        if name == "flash_attn_gpu.fwd":
            return fi.flash_attn_gpu.fwd(
                q, k, v, None, o["alibi_slopes"], o["dropout_p"], o["softmax_scale"], o["causal"], *window,
                o["softcap"], o["return_softmax"], None,
            )  # fmt: skip
        return list(
            getattr(fi, name)(
                q, k, v, o["dropout_p"], o["softmax_scale"], o["causal"], *window, o["softcap"],
                o["alibi_slopes"], o["return_softmax"],
            )
        )  # fmt: skip
    if name == "flash_attn_gpu.varlen_fwd":
        return fi.flash_attn_gpu.varlen_fwd(
            q, k, v, None, CU_Q, CU_K, None, None, None, o["alibi_slopes"], MAX_Q, MAX_K, o["dropout_p"],
            o["softmax_scale"], False, o["causal"], *window, o["softcap"], o["return_softmax"], None,
        )  # fmt: skip
    return list(
        getattr(fi, name)(
            q, k, v, CU_Q, CU_K, MAX_Q, MAX_K, o["dropout_p"], o["softmax_scale"], o["causal"], *window,
            o["softcap"], o["alibi_slopes"], o["return_softmax"],
        )
    )  # fmt: skip


def backward(
    name: str, t: dict[str, torch.Tensor], o: dict[str, Any], rng_state: torch.Tensor | None
) -> list[torch.Tensor]:
    import flash_attn.flash_attn_interface as fi

    grads = [torch.full_like(t[n], float("nan")) for n in ("q", "k", "v")]
    head = [t["dout"], t["q"], t["k"], t["v"], t["out"], t["softmax_lse"], *grads]
    window = (o["window_size_left"], o["window_size_right"])
    if name == "_flash_attn_backward":
        fi._flash_attn_backward(
            *head, o["dropout_p"], o["softmax_scale"], o["causal"], *window, o["softcap"], o["alibi_slopes"],
            False, rng_state,
        )  # fmt: skip
    elif name == "flash_attn_gpu.bwd":
        fi.flash_attn_gpu.bwd(
            *head, o["alibi_slopes"], o["dropout_p"], o["softmax_scale"], o["causal"], *window, o["softcap"],
            False, None, rng_state,
        )  # fmt: skip
    elif name == "_flash_attn_varlen_backward":
        fi._flash_attn_varlen_backward(
            *head, CU_Q, CU_K, MAX_Q, MAX_K, o["dropout_p"], o["softmax_scale"], o["causal"], *window,
            o["softcap"], o["alibi_slopes"], False, rng_state,
        )  # fmt: skip
    else:
        fi.flash_attn_gpu.varlen_bwd(
            *head, CU_Q, CU_K, o["alibi_slopes"], MAX_Q, MAX_K, o["dropout_p"], o["softmax_scale"], False,
            o["causal"], *window, o["softcap"], False, None, rng_state,
        )  # fmt: skip
    return grads


def sequences(total: bool) -> list[tuple[int, slice, slice]]:
    """(batch index, query rows, key rows) of each sequence."""
    if not total:
        return [(b, slice(None), slice(None)) for b in range(B)]
    return [
        (b, slice(int(CU_Q[b]), int(CU_Q[b + 1])), slice(int(CU_K[b]), int(CU_K[b + 1]))) for b in range(2)
    ]


def part(t: torch.Tensor, b: int, rows: slice, total: bool) -> torch.Tensor:
    return t[rows] if total else t[b]


def reference_options(o: dict[str, Any]) -> dict[str, Any]:
    return {
        "causal": o["causal"],
        "window": (o["window_size_left"], o["window_size_right"]),
        "scale": o["softmax_scale"],
        "softcap": o["softcap"],
        "slopes": o["alibi_slopes"],
    }


def test_every_forward_option_has_a_case() -> None:
    names = [n for n, _ in SIGNATURES["flash_attn.flash_attn_interface"]["_flash_attn_forward"]]
    assert set(names[3:]) == set(CHANGED) | {"dropout_p", "return_softmax"}


@pytest.mark.parametrize("name", PADDED + VARLEN)
@pytest.mark.parametrize("option", ["defaults", *CHANGED])
def test_forward_honours_each_option(name: str, option: str) -> None:
    total = name in VARLEN
    q, k, v = qkv(1, total)
    o = {**DEFAULTS, **CHANGED.get(option, {})}
    out, lse, s_dmask, rng_state = forward(name, q, k, v, o)
    assert s_dmask.numel() == 0  # no return_softmax
    assert rng_state.dtype == torch.int64
    assert rng_state.shape == (2,)
    causal_only = o["causal"] and o["window_size_left"] < 0
    for b, rows_q, rows_k in sequences(total):
        qb, kb, vb = part(q, b, rows_q, total), part(k, b, rows_k, total), part(v, b, rows_k, total)
        want_out, want_lse, _ = sequence_attention(qb, kb, vb, **reference_options(o))
        want_lse = flash_attn_lse(want_lse, o["alibi_slopes"], causal_only, qb.shape[0], kb.shape[0])
        got_lse = lse[:, rows_q] if total else lse[b]
        torch.testing.assert_close(part(out, b, rows_q, total), want_out, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(got_lse.double(), want_lse, rtol=1e-6, atol=1e-6)


def test_return_softmax_without_dropout_is_refused_as_in_flash_attn() -> None:
    q, k, v = qkv(2)
    with pytest.raises(RuntimeError, match=r"return_softmax is only supported when p_dropout > 0\.0"):
        forward("_flash_attn_forward", q, k, v, {**DEFAULTS, "return_softmax": True})


def dropped_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor, p: float, o: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence with a given keep mask (h, sq, sk): out = (P * keep / (1 - p)) v, its lse (without
    dropout, as flash-attn returns it), and P."""
    _, lse, probs = sequence_attention(q, k, v, **reference_options(o))
    kv_head = torch.arange(H) // (H // HK)
    out = torch.einsum("hij,jhd->ihd", probs * keep / (1 - p), v.double()[:, kv_head])
    return out, lse, probs


@pytest.mark.parametrize(
    ("fwd_name", "bwd_name"),
    [
        ("_flash_attn_forward", "_flash_attn_backward"),
        ("_wrapped_flash_attn_forward", "flash_attn_gpu.bwd"),
        ("_flash_attn_varlen_forward", "_flash_attn_varlen_backward"),
        ("flash_attn_gpu.varlen_fwd", "flash_attn_gpu.varlen_bwd"),
    ],
)
@pytest.mark.parametrize("option", ["defaults", "causal", "softcap"])
def test_dropout_forward_then_caller_driven_backward(fwd_name: str, bwd_name: str, option: str) -> None:
    total = fwd_name in VARLEN
    p = 0.3
    q, k, v = qkv(3, total)
    o = {**DEFAULTS, **CHANGED.get(option, {}), "dropout_p": p, "return_softmax": True}
    out, lse, s_dmask, rng_state = forward(fwd_name, q, k, v, o)
    rows = math.ceil((MAX_Q if total else SQ) / 128) * 128
    cols = math.ceil((MAX_K if total else SK) / 128) * 128
    assert s_dmask.shape == (B, H, rows, cols)
    assert rng_state.dtype == torch.int64
    g = torch.Generator().manual_seed(4)
    dout = torch.randn(out.shape, generator=g, dtype=F64)
    grads = backward(
        bwd_name, {"dout": dout, "q": q, "k": k, "v": v, "out": out, "softmax_lse": lse}, o, rng_state
    )
    kept = []
    for b, rows_q, rows_k in sequences(total):
        leaves = [
            part(t, b, r, total).clone().requires_grad_() for t, r in ((q, rows_q), (k, rows_k), (v, rows_k))
        ]
        sq, sk = leaves[0].shape[0], leaves[1].shape[0]
        signed = s_dmask[b, :, :sq, :sk]
        keep = signed >= 0  # flash-attn's sign code: a dropped entry is negative
        want_out, want_lse, probs = dropped_reference(*leaves, keep, p, o)
        torch.testing.assert_close(signed.abs(), probs.detach(), rtol=1e-9, atol=1e-9)
        assert s_dmask[b, :, sq:].abs().sum() == 0
        torch.testing.assert_close(part(out, b, rows_q, total), want_out.detach(), rtol=1e-9, atol=1e-9)
        got_lse = lse[:, rows_q] if total else lse[b]
        torch.testing.assert_close(got_lse.double(), want_lse.detach(), rtol=1e-6, atol=1e-6)
        want = torch.autograd.grad(want_out, leaves, part(dout, b, rows_q, total))
        for name, got, ref, rws in zip(
            ("dq", "dk", "dv"), grads, want, (rows_q, rows_k, rows_k), strict=True
        ):
            torch.testing.assert_close(
                part(got, b, rws, total), ref, rtol=1e-6, atol=1e-6, msg=f"{bwd_name} {name}"
            )
        kept.append(keep[probs > 0])
    fraction = torch.cat(kept).double().mean().item()
    assert 0.55 < fraction < 0.85  # about 1 - p of the entries kept


def test_rng_state_follows_torch_manual_seed_and_replays_the_mask() -> None:
    q, k, v = qkv(5)
    o = {**DEFAULTS, "dropout_p": 0.5}
    torch.manual_seed(11)
    first = forward("_flash_attn_forward", q, k, v, o)
    second = forward("_flash_attn_forward", q, k, v, o)
    torch.manual_seed(11)
    again = forward("_flash_attn_forward", q, k, v, o)
    assert torch.equal(first[3], again[3])
    assert torch.equal(first[0], again[0])
    assert not torch.equal(first[3], second[3])
    assert not torch.equal(first[0], second[0])  # another mask
    t = {"dout": torch.ones_like(q), "q": q, "k": k, "v": v, "out": first[0], "softmax_lse": first[1]}
    grads_first = backward("_flash_attn_backward", t, o, first[3])
    grads_second = backward("_flash_attn_backward", t, o, second[3])
    assert not torch.equal(grads_first[2], grads_second[2])  # dv reads the mask the state names


@pytest.mark.parametrize("name", ["_flash_attn_backward", "flash_attn_gpu.varlen_bwd"])
def test_dropout_backward_without_rng_state_is_refused(name: str) -> None:
    total = "varlen" in name
    q, k, v = qkv(6, total)
    t = {"dout": q, "q": q, "k": k, "v": v, "out": q, "softmax_lse": torch.zeros(1)}
    with pytest.raises(RuntimeError, match=r"rng_state: the backward of a call with p_dropout 0\.1"):
        backward(name, t, {**DEFAULTS, "dropout_p": 0.1}, None)


@pytest.mark.parametrize("name", ["_wrapped_flash_attn_forward", "_wrapped_flash_attn_varlen_forward"])
def test_wrapped_forward_with_dropout_compiles_with_its_s_dmask(name: str) -> None:
    """The torch.library ops' fake kernels give S_dmask's shape when return_softmax is set, so a traced
    caller (diffusers compiles them) sees what the op returns."""
    total = name in VARLEN
    q, k, v = qkv(7, total)
    options = {**DEFAULTS, "dropout_p": 0.2, "return_softmax": True}

    def shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
        return forward(name, q, k, v, options)

    eager = shapes(q, k, v)
    compiled = torch.compile(shapes, fullgraph=True, backend="aot_eager")(q, k, v)
    assert [t.shape for t in compiled] == [t.shape for t in eager]
    assert eager[2].shape[-2:] == (128, 128)
