"""The public API on fa's kernels (CPU emulator, sm 8.0 tiles, fp16/bf16) at tiny shapes.

Results meet FA2's error rule against the fp32 reference (tests/gpu/attn_reference.py): at most twice
the error of the same math done by PyTorch in the inputs' dtype. Calls the kernels cannot serve must
fall back with `feature-unsupported` naming the missing feature.
"""

from __future__ import annotations

import emu_harness
import fa_attn
import pytest
import torch
from attn_reference import assert_fa2_close, attention_ref
from emulated import kernels_on_cpu
from kvcache_reference import rotate_complex

pytestmark = [
    pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning"),
    pytest.mark.skipif(
        emu_harness.cxx() is None, reason="the kernel emulator needs a host C++ compiler (g++)"
    ),
]


@pytest.fixture
def kernels(monkeypatch):
    with kernels_on_cpu(monkeypatch):
        yield


def rand(*shape, dtype=torch.float16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def on_kernels() -> None:
    route = fa_attn.last_dispatch()
    assert route is not None and route.path == "sass", route


def falls_back_for(feature: str) -> None:
    route = fa_attn.last_dispatch()
    assert route is not None and route.path == "fallback"
    assert any(r.code == "feature-unsupported" and feature in r.message for r in route.reasons), route.reasons


def check(name, out, q, k, v, causal=False, window=(-1, -1), softcap=0.0) -> None:
    ref, _ = attention_ref(q, k, v, causal, window=window, softcap=softcap)
    low, _ = attention_ref(q, k, v, causal, upcast=False, window=window, softcap=softcap)
    assert_fa2_close(name, out, ref, low)


CASES = {
    "causal-gqa": ({"causal": True}, (2, 37, 53, 4, 2, 32)),
    "window-list": ({"window_size": [7, 3]}, (1, 40, 40, 2, 1, 32)),
    "window-tensor-causal": ({"window_size": torch.tensor([9, 0]), "causal": True}, (1, 33, 45, 2, 2, 32)),
    "softcap": ({"softcap": 3.0}, (2, 17, 29, 2, 2, 32)),
    "head-dim-20": ({"causal": True}, (1, 21, 21, 2, 1, 20)),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_flash_attn_func_on_kernels(kernels, case: str, dtype: torch.dtype) -> None:
    options, (b, sq, sk, h, hk, d) = CASES[case]
    q, k, v = (
        rand(b, sq, h, d, dtype=dtype),
        rand(b, sk, hk, d, dtype=dtype, seed=1),
        rand(b, sk, hk, d, dtype=dtype, seed=2),
    )
    out, lse = fa_attn.flash_attn_func(q, k, v, **options, return_lse=True)
    on_kernels()
    window = tuple(int(w) for w in options.get("window_size", (-1, -1)))
    check("out", out, q, k, v, options.get("causal", False), window, options.get("softcap", 0.0))
    _, ref_lse = attention_ref(
        q, k, v, options.get("causal", False), window=window, softcap=options.get("softcap", 0.0)
    )
    seen = torch.isfinite(ref_lse)
    assert torch.all(torch.isposinf(lse[~seen])), "rows that see no key: lse +inf"
    torch.testing.assert_close(
        lse[seen], ref_lse[seen], rtol=1e-3, atol=1e-3
    )  # fp32 sums of rounded-product terms
    packed = fa_attn.flash_attn_kvpacked_func(q, torch.stack((k, v), dim=2), **options)
    on_kernels()
    check("kvpacked", packed, q, k, v, options.get("causal", False), window, options.get("softcap", 0.0))


def test_backward_on_kernels(kernels) -> None:
    q, k, v = rand(1, 29, 4, 32), rand(1, 41, 2, 32, seed=1), rand(1, 41, 2, 32, seed=2)
    dout = rand(1, 29, 4, 32, seed=3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fa_attn.flash_attn_func(*leaves, causal=True)
    on_kernels()
    grads = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [t.float().requires_grad_() for t in (q, k, v)]
    low_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(attention_ref(*ref_leaves, True)[0], ref_leaves, dout.float())
    low = torch.autograd.grad(attention_ref(*low_leaves, True, upcast=False)[0], low_leaves, dout)
    for name, ours, r, lo in zip(("dq", "dk", "dv"), grads, ref, low):
        assert_fa2_close(name, ours, r, lo)


def test_varlen_and_qkvpacked_on_kernels(kernels) -> None:
    lens = [5, 31, 1, 18]
    cu = torch.tensor([0, 5, 36, 37, 55], dtype=torch.int32)
    qkv = rand(55, 3, 2, 32)
    out = fa_attn.flash_attn_varlen_qkvpacked_func(qkv, cu, torch.tensor(31, dtype=torch.int32), causal=True)
    on_kernels()
    start = 0
    for n in lens:
        q, k, v = (qkv[start : start + n, i].unsqueeze(0) for i in range(3))
        check(f"sequence at {start}", out[start : start + n].unsqueeze(0), q, k, v, causal=True)
        start += n


def test_kvcache_uniform_cache_on_kernels(kernels) -> None:
    """A contiguous cache, one length for every sequence, new keys appended with rotary: ordinary
    attention over the first cache_seqlens + seqlen_new rows, bottom-right aligned: the kernels run it."""
    b, cap, hk, h, d, filled, new = 2, 48, 2, 4, 32, 30, 3
    q, k_new, v_new = rand(b, new, h, d), rand(b, new, hk, d, seed=1), rand(b, new, hk, d, seed=2)
    k_cache, v_cache = rand(b, cap, hk, d, seed=3), rand(b, cap, hk, d, seed=4)
    angle = torch.rand(cap, 8, generator=torch.Generator().manual_seed(5)) * 6.3
    cos, sin = angle.cos().half(), angle.sin().half()
    out = fa_attn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cos, sin, cache_seqlens=torch.tensor(filled), causal=True,
        rotary_interleaved=False,
    )  # fmt: skip
    on_kernels()
    positions = torch.arange(new) + filled
    q_rot = torch.stack([rotate_complex(q[i], cos, sin, positions, False) for i in range(b)]).half()
    k_rot = torch.stack([rotate_complex(k_new[i], cos, sin, positions, False) for i in range(b)]).half()
    assert_fa2_close("appended keys", k_cache[:, filled : filled + new], k_rot.float(), k_rot)
    assert torch.equal(v_cache[:, filled : filled + new], v_new)
    end = filled + new
    check("out", out, q_rot, k_cache[:, :end], v_cache[:, :end], causal=True)


@pytest.mark.parametrize(
    ("layout", "feature"),
    [
        ("ragged", "seqused_k"),
        ("leftpad", "leftpad_k"),
        ("batch_idx", "cache_batch_idx"),
        ("paged", "paged_kv"),
    ],
)
def test_kvcache_layouts_the_kernels_lack_fall_back(kernels, layout: str, feature: str) -> None:
    b, cap, hk, h, d = 2, 16, 2, 4, 32
    q = rand(b, 1, h, d)
    k_cache, v_cache = rand(b + 1, cap, hk, d, seed=1), rand(b + 1, cap, hk, d, seed=2)
    args = {"cache_seqlens": torch.tensor([9, 9], dtype=torch.int32)}
    if layout == "ragged":
        args["cache_seqlens"] = torch.tensor([9, 4], dtype=torch.int32)
    elif layout == "leftpad":
        args["cache_leftpad"] = torch.tensor([2, 0], dtype=torch.int32)
    elif layout == "batch_idx":
        args["cache_batch_idx"] = torch.tensor([2, 0], dtype=torch.int32)
    else:
        k_cache, v_cache = k_cache.reshape(-1, 4, hk, d), v_cache.reshape(-1, 4, hk, d)
        args["block_table"] = torch.tensor([[3, 1, 0, 5], [2, 4, 6, 7]], dtype=torch.int32)
    if layout != "batch_idx" and layout != "paged":
        k_cache, v_cache = k_cache[:b], v_cache[:b]
    fa_attn.flash_attn_with_kvcache(q, k_cache, v_cache, causal=True, **args)
    falls_back_for(feature)


def test_paged_varlen_and_alibi_fall_back(kernels) -> None:
    q, k = rand(1, 8, 2, 32), rand(1, 8, 2, 32, seed=1)
    fa_attn.flash_attn_func(q, k, k, alibi_slopes=torch.full((2,), 0.1))
    falls_back_for("alibi")
    cu = torch.tensor([0, 8], dtype=torch.int32)
    fa_attn.flash_attn_varlen_func(q[0], k.reshape(2, 4, 2, 32), k.reshape(2, 4, 2, 32), cu, cu, 8, 8,
                                   block_table=torch.tensor([[1, 0]], dtype=torch.int32))  # fmt: skip
    falls_back_for("paged_kv")
