"""fa as torch's SDPA flash implementation (torch >= 2.13's registry, fa_attn/standin/sdpa.py): registered on
import and never activated; once activated, SDPA's flash operators run fa's kernels (here the emulated
ones, registered for the CPU as tests/api does) with fa's reasons, forward and backward."""

from __future__ import annotations

import emu_harness
import emulated
import fa_attn
import pytest
import torch
from attn_reference import assert_fa2_close, attention_ref
from emulated import kernels_on_cpu
from fa_attn.standin import sdpa

pytestmark = [
    pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning"),
    pytest.mark.skipif(not sdpa.supported(), reason="torch before 2.13 has no flash-attention registry"),
]
registry = torch.nn.attention


@pytest.fixture
def activated_on_cpu(monkeypatch):
    """fa activated through torch's registry, its implementations registered for the CPU."""
    monkeypatch.setattr(sdpa, "DISPATCH_KEY", "CPU")
    registry.activate_flash_attention_impl(sdpa.NAME)
    yield
    registry.restore_flash_attention_impl()


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.float16)


def test_registered_on_import_and_not_active() -> None:
    assert sdpa.NAME in registry.list_flash_attention_impls()
    assert registry.current_flash_attention_impl() != sdpa.NAME


def test_activation_is_the_users_and_restore_undoes_it() -> None:
    registry.activate_flash_attention_impl(sdpa.NAME)
    try:
        assert registry.current_flash_attention_impl() == sdpa.NAME
    finally:
        registry.restore_flash_attention_impl()
    assert registry.current_flash_attention_impl() is None


@pytest.mark.skipif(emu_harness.cxx() is None, reason="the kernel emulator needs a host C++ compiler (g++)")
@pytest.mark.usefixtures("activated_on_cpu")
def test_sdpa_flash_operator_runs_fas_kernels_forward_and_backward(monkeypatch) -> None:
    """SDPA's flash path (aten::_scaled_dot_product_flash_attention, (batch, heads, seqlen, dim)) and the
    backward autograd derives for it, on fa's emulated sm 8.0 kernels, against the fp32 reference."""
    q, k, v = rand(1, 2, 33, 32), rand(1, 2, 33, 32, seed=1), rand(1, 2, 33, 32, seed=2)
    dout = rand(1, 2, 33, 32, seed=3)
    with kernels_on_cpu(monkeypatch):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(*leaves, is_causal=True)
        route = fa_attn.last_dispatch()
        grads = torch.autograd.grad(out, leaves, dout)
    assert route is not None
    assert route.path == "sass"
    assert [op for op, _ in emulated.LAUNCHED] == ["fwd"]  # the backward kernel read out and lse: no re-run
    assert lse.shape == (1, 2, 33)
    bshd = [t.transpose(1, 2) for t in (q, k, v)]
    ref, _ = attention_ref(*bshd, True)
    low, _ = attention_ref(*bshd, True, upcast=False)
    assert_fa2_close("out", out.transpose(1, 2), ref, low)
    ref_leaves = [t.float().requires_grad_() for t in bshd]
    ref_grads = torch.autograd.grad(
        attention_ref(*ref_leaves, True)[0], ref_leaves, dout.transpose(1, 2).float()
    )
    low_leaves = [t.clone().requires_grad_() for t in bshd]
    low_grads = torch.autograd.grad(
        attention_ref(*low_leaves, True, upcast=False)[0], low_leaves, dout.transpose(1, 2)
    )
    for name, ours, r, lo in zip(("dq", "dk", "dv"), grads, ref_grads, low_grads, strict=True):
        assert_fa2_close(name, ours.transpose(1, 2), r, lo)


@pytest.mark.usefixtures("activated_on_cpu")
def test_a_call_the_kernels_cannot_serve_takes_fas_fallback_with_its_reason() -> None:
    q = torch.randn(1, 2, 5, 16)  # fp32 on the CPU: fa's fallback, reason recorded
    out, *_ = torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, is_causal=True)
    route = fa_attn.last_dispatch()
    assert route is not None
    assert route.path == "fallback"
    assert route.reasons
    want = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.testing.assert_close(out, want)


@pytest.mark.usefixtures("activated_on_cpu")
def test_dropout_is_refused_with_what_to_do() -> None:
    q = torch.randn(1, 2, 5, 16)
    with pytest.raises(RuntimeError, match="restore_flash_attention_impl"):
        torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, dropout_p=0.1)
