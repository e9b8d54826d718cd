"""torch.compile and the fa_attn:: ops on a CPU: no graph breaks, working fake kernels, autograd formula.

The CUDA kernels cannot run here, so the kernel path is exercised with CPU stand-ins registered for the
ops in this file only (plain attention math): they check the arguments the runtime passes (padded head
dim, launch data) and let autograd run through the ops' registered backward.
"""

from __future__ import annotations

import math
import warnings

import fa_attn
import pytest
import torch
from fa_attn.runtime import interface
from fa_attn.runtime.dispatch import Dispatch
from fa_attn.runtime.ops import KernelLaunch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

pytestmark = pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")

FWD = KernelLaunch("/pkg/kernels/sm_80/fwd_fp16_d32.cubin", "fa_fwd", (32, 128, 128, 64, 49152, 0))
BWD = KernelLaunch(
    "/pkg/kernels/sm_80/bwd_fp16_d32.cubin",
    "fa_bwd_preprocess,fa_bwd,fa_bwd_convert_dq",
    (32,) + (128, 64, 64, 1000, 0) * 3,
)


def test_compile_fullgraph_fallback_forward_and_backward() -> None:
    q, k, v = (torch.randn(2, 5, 4, 16), torch.randn(2, 7, 2, 16), torch.randn(2, 7, 2, 16))

    def f(q, k, v):
        out, lse = fa_attn.flash_attn_func(q, k, v, causal=True, return_lse=True)
        return out.sum() + lse.sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    eager_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled(*leaves).backward()
    f(*eager_leaves).backward()
    for got, want in zip(leaves, eager_leaves, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_decision_is_marked_like_the_public_decorator_marks() -> None:
    def probe() -> None:
        return None

    torch.compiler.assume_constant_result(probe)
    assert vars(probe) == {"_dynamo_marked_constant": True}, "torch changed assume_constant_result"
    assert interface._decide_for._dynamo_marked_constant is True


def test_import_does_not_load_dynamo() -> None:
    import os
    import subprocess
    import sys

    code = "import sys, torch, fa_attn; print('torch._dynamo' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


def fwd_args(q, k, v, cu_q=None, cu_k=None, *, max_q=100, max_k=120, scale=0.125):
    """The fa_attn::fwd arguments for a causal call with the stand-in launches and no KV-cache layout."""
    return (
        q,
        k,
        v,
        cu_q,
        cu_k,
        None,  # seqused_k, leftpad_k, kv_batch_idx, block_table: no KV-cache layout
        None,
        None,
        None,
        max_q,
        max_k,
        scale,
        True,
        -1,
        0,
        0.0,
        FWD.module,
        FWD.entries,
        list(FWD.launch),
        BWD.module,
        BWD.entries,
        list(BWD.launch),
    )


def test_fake_cuda_tensors_trace_both_ops() -> None:
    with FakeTensorMode():
        q = torch.empty(2, 100, 8, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 120, 2, 64, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(2, 120, 2, 64, dtype=torch.bfloat16, device="cuda")
        graph = make_fx(lambda q, k, v: torch.ops.fa_attn.fwd(*fwd_args(q, k, v)))(q, k, v)
        out, lse = torch.ops.fa_attn.fwd(*fwd_args(q, k, v))
        dq, dk, dv = torch.ops.fa_attn.bwd(
            out,
            q,
            k,
            v,
            out,
            lse,
            None,
            None,
            100,
            120,
            0.125,
            True,
            -1,
            0,
            0.0,
            BWD.module,
            BWD.entries,
            list(BWD.launch),
        )
        packed = torch.empty(300, 8, 64, dtype=torch.float16, device="cuda")
        cu = torch.empty(4, dtype=torch.int32, device="cuda")
        _, varlen_lse = torch.ops.fa_attn.fwd(*fwd_args(packed, packed, packed, cu, cu))
    assert (out.shape, out.device.type, out.dtype) == (q.shape, "cuda", torch.bfloat16)
    assert (lse.shape, lse.dtype) == ((2, 8, 100), torch.float32)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)  # dk/dv per kv head (GQA summed)
    assert varlen_lse.shape == (8, 300)
    calls = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert torch.ops.fa_attn.fwd.default in calls


# ---- the kernel path with CPU stand-ins for the CUDA kernels ------------------------------------


def _scores(q, k, scale, causal):
    group = q.shape[2] // k.shape[2]
    kf = k.repeat_interleave(group, dim=2).transpose(1, 2).double()
    s = q.transpose(1, 2).double() @ kf.transpose(-1, -2) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        rows = torch.arange(sq).unsqueeze(1) + sk - sq
        s = s.masked_fill(torch.arange(sk).unsqueeze(0) > rows, -math.inf)
    return s


seen: list[tuple] = []


def _cpu_fwd(
    q,
    k,
    v,
    cu_q,
    cu_k,
    seqused_k,
    leftpad_k,
    kv_batch_idx,
    block_table,
    max_q,
    max_k,
    scale,
    causal,
    wl,
    wr,
    softcap,
    module,
    entries,
    launch,
    bwd_module,
    bwd_entries,
    bwd_launch,
):
    seen.append((q.shape[-1], module, entries, tuple(launch), bwd_entries))
    group = q.shape[2] // k.shape[2]
    s = _scores(q, k, scale, causal)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    out = p @ v.repeat_interleave(group, dim=2).transpose(1, 2).double()
    return out.transpose(1, 2).to(q.dtype).contiguous(), lse.float()


def _cpu_bwd(
    dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, causal, wl, wr, softcap, module, entries, launch
):
    # FlashAttention-2's backward formulas (what fa_bwd computes), in fp64.
    group = q.shape[2] // k.shape[2]
    s = _scores(q, k, scale, causal)
    p = torch.exp(s - lse.double().unsqueeze(-1))
    do = dout.transpose(1, 2).double()
    vf = v.repeat_interleave(group, dim=2).transpose(1, 2).double()
    kf = k.repeat_interleave(group, dim=2).transpose(1, 2).double()
    dv = p.transpose(-1, -2) @ do
    dp = do @ vf.transpose(-1, -2)
    d = (do * out.transpose(1, 2).double()).sum(-1, keepdim=True)
    ds = p * (dp - d)
    dq = ds @ kf * scale
    dk = ds.transpose(-1, -2) @ q.transpose(1, 2).double() * scale

    def per_kv_head(x, like):  # sum the query heads of each kv head, like the binding
        b, h, s_, dim = x.shape
        return x.reshape(b, h // group, group, s_, dim).sum(2).transpose(1, 2).to(like.dtype).contiguous()

    return dq.transpose(1, 2).to(q.dtype).contiguous(), per_kv_head(dk, k), per_kv_head(dv, v)


@pytest.fixture
def kernel_path_on_cpu(monkeypatch):
    lib = torch.library.Library("fa_attn", "IMPL")
    lib.impl("fwd", _cpu_fwd, "CPU")
    lib.impl("bwd", _cpu_bwd, "CPU")
    route = Dispatch("sass", "8.0", (), 24, FWD, BWD)
    # The decision's answer (eager and compiled calls both ask interface._decide_for).
    monkeypatch.setattr(interface, "_decide_for", lambda *_facts: route)
    monkeypatch.setattr(interface, "_kept_routes", {})
    monkeypatch.setenv("FA_SELF_CHECK", "off")  # a stand-in for the kernels, not a unit to verify
    seen.clear()
    yield
    lib._destroy()


def test_kernel_path_pads_calls_and_differentiates(kernel_path_on_cpu) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 6, 4, 20, generator=gen, dtype=torch.float64).requires_grad_(),
        torch.randn(2, 9, 2, 20, generator=gen, dtype=torch.float64).requires_grad_(),
        torch.randn(2, 9, 2, 20, generator=gen, dtype=torch.float64).requires_grad_(),
    )
    out, lse = fa_attn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.shape == q.shape
    assert lse.shape == (2, 4, 6)
    assert seen[0] == (24, FWD.module, "fa_fwd", FWD.launch, BWD.entries)  # head dim 20 padded to 24
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        ref = fa_attn.fallback.attention(
            fa_attn.inputs.check_padded(*ref_leaves, 0.0, None, True, (-1, -1), 0.0, None, False),
            *ref_leaves,
            want_lse=False,
        )[0]
    torch.testing.assert_close(out, ref)
    for got, want in zip(grads, torch.autograd.grad(ref.sum(), ref_leaves), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)  # the LSE travels in fp32


def test_kernel_path_compiles_without_graph_breaks(kernel_path_on_cpu) -> None:
    q, k, v = (torch.randn(1, 4, 2, 24, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return fa_attn.flash_attn_func(q, k, v, causal=True).square().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    want = torch.autograd.grad(f(q, k, v), (q, k, v))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert any(entry[0] == 24 for entry in seen)


def test_opcheck_schema_fake_autograd_and_aot(kernel_path_on_cpu) -> None:
    """torch.library.opcheck (torch >= 2.4): schema, fake kernel, autograd registration and AOT dispatch
    with dynamic shapes agree with the (stand-in) real kernel."""
    q = torch.randn(2, 6, 4, 24, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 9, 2, 24, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 9, 2, 24, dtype=torch.float64, requires_grad=True)
    args = fwd_args(q, k, v, max_q=6, max_k=9, scale=0.2)
    results = torch.library.opcheck(torch.ops.fa_attn.fwd.default, args)
    assert set(results.values()) == {"SUCCESS"}, results


def test_first_eager_call_loads_the_routes_kernels_and_capture_never_does(
    kernel_path_on_cpu, monkeypatch
) -> None:
    """fa_attn/runtime/preload.py with the CPU stand-ins as the GPU: the first eager call issues one empty op
    call (batch 0) per module of its route (forward and backward) before the real one; a later call,
    and any call under graph capture, issues none (the binding's side: tests/runtime/test_launch_checks)."""
    monkeypatch.setattr(fa_attn.preload, "on_gpu", lambda _t: True)
    monkeypatch.setattr(fa_attn.preload, "_loaded", set())
    monkeypatch.setattr(fa_attn.preload, "_ready", {})
    capture = [True]
    monkeypatch.setattr(fa_attn.preload, "capturing", lambda: capture[0])
    q, k, v = (torch.randn(1, 4, 2, 24, dtype=torch.float64) for _ in range(3))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    fa_attn.flash_attn_func(q, k, v)  # a first call inside capture: nothing loads here
    assert [entry[1] for entry in seen] == [FWD.module]
    seen.clear()
    capture[0] = False
    fa_attn.flash_attn_func(q, k, v)  # the first eager call: empty calls for fwd and bwd, then the call
    loads = [(entry[0], entry[1], entry[2]) for entry in seen[:2]]
    assert loads == [(FWD.launch[0], FWD.module, FWD.entries), (BWD.launch[0], BWD.module, BWD.entries)]
    assert len(seen) == 3
    seen.clear()
    capture[0] = True
    fa_attn.flash_attn_func(q, k, v)  # captured after: the real call only
    fa_attn.flash_attn_func(q, k, v)
    assert [entry[1] for entry in seen] == [FWD.module, FWD.module]
