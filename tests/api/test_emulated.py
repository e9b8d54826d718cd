"""The public API on fa's kernels (CPU emulator, sm 8.0 tiles, fp16/bf16) at tiny shapes.

Results meet FA2's error rule against the fp32 reference (tests/gpu/attn_reference.py): at most twice
the error of the same math done by PyTorch in the inputs' dtype. Calls the kernels cannot serve must
fall back with `feature-unsupported` naming the missing feature.
"""

from __future__ import annotations

import emu_harness
import emulated
import fa_attn
import pytest
import torch
from attn_reference import assert_fa2_close, attention_ref
from emulated import kernels_on_cpu
from kvcache_cases import KV_CASES, check_kvcache, kvcache_case, reference_of
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
    assert route is not None, route
    assert route.path == "sass", route


def falls_back_for(feature: str) -> None:
    route = fa_attn.last_dispatch()
    assert route is not None
    assert route.path == "fallback"
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
@pytest.mark.usefixtures("kernels")
def test_flash_attn_func_on_kernels(case: str, dtype: torch.dtype) -> None:
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


@pytest.mark.usefixtures("kernels")
def test_backward_on_kernels() -> None:
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
    for name, ours, r, lo in zip(("dq", "dk", "dv"), grads, ref, low, strict=True):
        assert_fa2_close(name, ours, r, lo)


@pytest.mark.usefixtures("kernels")
def test_varlen_and_qkvpacked_on_kernels() -> None:
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


@pytest.mark.usefixtures("kernels")
def test_kvcache_uniform_cache_on_kernels() -> None:
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


@pytest.mark.parametrize("name", list(KV_CASES))
@pytest.mark.usefixtures("kernels")
def test_kvcache_layouts_on_kernels(name: str) -> None:
    """Every KV-cache layout on the kernels: the output, the LSE and the appended cache against the
    float64 reference (kvcache_cases.check_kvcache), under FA2's rule; decode through the split-KV
    forward by decision.num_splits (num_splits=0) or as the caller asks (1: never, n: n shares)."""
    args = kvcache_case(name)
    reference = reference_of(args)
    out, lse = fa_attn.flash_attn_with_kvcache(**args, return_softmax_lse=True)
    on_kernels()
    [(op, splits)] = emulated.LAUNCHED
    requested, page = args["num_splits"], KV_CASES[name][1]
    if requested == 1 or page == 64:  # 64-key pages hold no whole split-KV block (128 keys) of d32
        assert op == "fwd", emulated.LAUNCHED
    else:
        assert op == "fwd_splitkv", emulated.LAUNCHED
        assert splits == (requested or splits) > 1, emulated.LAUNCHED
    if page == 64:  # and the dispatch says so, rather than dropping split-KV without a word
        route = fa_attn.last_dispatch()
        assert route is not None
        assert [n.code for n in route.notes] == ["splitkv-unavailable"], route
        assert "pages of 64 keys" in route.notes[0].message
    check_kvcache(args, reference, out, lse)


@pytest.mark.usefixtures("kernels")
def test_varlen_over_pages_on_kernels() -> None:
    """flash_attn_varlen_func(block_table=...): packed queries over paged keys, forward on the kernels;
    with gradients it falls back (the kernels have no backward for pages)."""
    gen = torch.Generator().manual_seed(21)
    lens_q, lens_k, page, hk = [3, 1, 2], [200, 17, 130], 128, 2
    q = torch.randn(sum(lens_q), 4, 32, generator=gen).half()
    k_pages, v_pages = (torch.randn(7, page, hk, 32, generator=gen).half() for _ in range(2))
    table = torch.tensor([[5, 1], [3, 0], [2, 6]], dtype=torch.int32)
    cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    args = (q, k_pages, v_pages, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k))
    out = fa_attn.flash_attn_varlen_func(*args, causal=True, block_table=table)
    on_kernels()
    start = 0
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k, strict=False)):
        keys = torch.cat([k_pages[p] for p in table[b].tolist()])[:nk].unsqueeze(0)
        values = torch.cat([v_pages[p] for p in table[b].tolist()])[:nk].unsqueeze(0)
        check(f"sequence {b}", out[start : start + nq].unsqueeze(0), q[start : start + nq].unsqueeze(0), keys,
              values, causal=True)  # fmt: skip
        start += nq
    leaf = q.clone().requires_grad_()
    fa_attn.flash_attn_varlen_func(leaf, *args[1:], causal=True, block_table=table)
    route = fa_attn.last_dispatch()
    assert route is not None
    assert [r.code for r in route.reasons] == ["backward-unsupported"], route


@pytest.mark.usefixtures("kernels")
def test_pages_smaller_than_the_key_block_fall_back() -> None:
    """Pages of 16 keys: the d32 kernels read blocks of 64 keys from one page, so the call falls back,
    saying which page size would run."""
    gen = torch.Generator().manual_seed(22)
    q = torch.randn(2, 1, 4, 32, generator=gen).half()
    k_cache, v_cache = (torch.randn(8, 16, 2, 32, generator=gen).half() for _ in range(2))
    table = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    out = fa_attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor([40, 64]).int(),
                                          block_table=table)  # fmt: skip
    falls_back_for("paged_kv")
    route = fa_attn.last_dispatch()
    assert route is not None
    assert "multiple of 64" in route.reasons[0].fix
    for b, n in enumerate((40, 64)):
        keys = torch.cat([k_cache[p] for p in table[b].tolist()])[:n].unsqueeze(0)
        values = torch.cat([v_cache[p] for p in table[b].tolist()])[:n].unsqueeze(0)
        ref = attention_ref(q[b : b + 1].float(), keys.float(), values.float(), False)[0]
        torch.testing.assert_close(out[b : b + 1].float(), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.usefixtures("kernels")
def test_alibi_falls_back() -> None:
    q, k = rand(1, 8, 2, 32), rand(1, 8, 2, 32, seed=1)
    fa_attn.flash_attn_func(q, k, k, alibi_slopes=torch.full((2,), 0.1))
    falls_back_for("alibi")


@pytest.mark.usefixtures("kernels")
def test_private_varlen_backward_runs_the_backward_kernel_on_out_and_lse() -> None:
    """flash_attn_gpu.varlen_bwd (ring attention's hot path) reads the caller's out and softmax_lse with
    fa's backward kernel, without running the forward again."""
    from fa_attn.standin import extension as flash_attn_ext

    q, k, v = rand(40, 4, 32), rand(40, 2, 32, seed=1), rand(40, 2, 32, seed=2)
    dout = rand(40, 4, 32, seed=3)
    cu = torch.tensor([0, 17, 40], dtype=torch.int32)
    out, lse, _, _ = flash_attn_ext.varlen_fwd(
        q,
        k,
        v,
        None,
        cu,
        cu,
        None,
        None,
        None,
        None,
        23,
        23,
        0.0,
        32**-0.5,
        False,
        True,
        -1,
        -1,
        0.0,
        False,
        None,
    )
    on_kernels()
    emulated.LAUNCHED.clear()
    dq, dk, dv, _ = flash_attn_ext.varlen_bwd(
        dout, q, k, v, out, lse, None, None, None, cu, cu, None, 23, 23, 0.0, 32**-0.5, False, True, -1, -1, 0.0,
        False, None, None,
    )  # fmt: skip
    on_kernels()
    assert emulated.LAUNCHED == []  # no forward ran again
    for b, (start, end) in enumerate(((0, 17), (17, 40))):
        leaves = [t[start:end].unsqueeze(0).float().requires_grad_() for t in (q, k, v)]
        low_leaves = [t[start:end].unsqueeze(0).clone().requires_grad_() for t in (q, k, v)]
        seq_dout = dout[start:end].unsqueeze(0)
        ref = torch.autograd.grad(attention_ref(*leaves, True)[0], leaves, seq_dout.float())
        low = torch.autograd.grad(attention_ref(*low_leaves, True, upcast=False)[0], low_leaves, seq_dout)
        for name, ours, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low, strict=True):
            assert_fa2_close(f"{name}[{b}]", ours[start:end].unsqueeze(0), r, lo)
