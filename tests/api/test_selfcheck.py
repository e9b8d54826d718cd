"""The runtime never uses a kernel that failed where it runs (fa_attn.selfcheck), on the emulated kernels.

A fault is injected into one unit's results through the emulated-kernel path (tests/api/emulated.py):
the first-use self-check must catch it, the call and later ones fall back with `self-check-failed` and
give SDPA's output exactly. Records of `fa check` decide instead of a check, speed ratios in them route
to SDPA (`slower-than-sdpa`) unless FA_ROUTE=fa, and where no check can run (graph capture) the call runs
unchecked and says so, or falls back under FA_SELF_CHECK=strict. The runtime's own decision and
admission run (fixture real_path); the device and the binding are the only stand-ins.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from pathlib import Path

import emu_harness
import emulated
import fa_attn
import pytest
import torch
from emulated import kernels_on_cpu
from fa_attn.runtime import dispatch, interface
from fa_attn.verify import record as records
from fa_attn.verify import selfcheck

from buildtool.emucheck import ops as emu_ops

pytestmark = pytest.mark.skipif(
    emu_harness.cxx() is None, reason="the kernel emulator needs a host C++ compiler (g++)"
)

SHAPE = (1, 40, 2, 32)  # batch, seqlen, heads, head dim: tiny


def qkv(seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*SHAPE, generator=gen).half() for _ in range(3))


def sdpa_output(q, k, v) -> torch.Tensor:
    """What the fallback gives on the CPU (the tensors are not on a GPU: `device-not-cuda`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fa_attn.FaFallbackWarning)
        return fa_attn.flash_attn_func(q, k, v, causal=True)


def fwd_unit() -> str:
    q, k, v = qkv()
    route = fa_attn.explain(q, k, v, causal=True)
    assert route.fwd is not None, route
    return records.unit_name(route.fwd.module)


def write_record(unit: str, result: records.UnitResult) -> None:
    key = emulated.gpu_key(torch.device("cpu"))
    records.write(records.Record(key, "2026-11-25T03:00:00Z", "fa check", {unit: result}))
    selfcheck.reset()


@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
def test_a_faulty_unit_is_caught_at_first_use_and_never_used_again(monkeypatch) -> None:
    q, k, v = qkv()
    expected = sdpa_output(q, k, v)
    with kernels_on_cpu(monkeypatch):
        monkeypatch.setenv("FA_SELF_CHECK", "first-use")
        monkeypatch.setattr(
            selfcheck, "key_of", lambda _d: records.RecordKey("none", "emulated", "8.0", "", "")
        )
        monkeypatch.setenv(records.RECORDS_ENV, "/nonexistent-fa-records")
        healthy = emulated.H.forward

        def faulty(lib, call):  # a unit whose output is off by a tenth of itself
            out, lse = healthy(lib, call)
            return out * 1.1, lse

        monkeypatch.setattr(emulated.H, "forward", faulty)
        with pytest.warns(
            selfcheck.FaSelfCheckWarning, match=r"unit sm_80/\S+ failed its first-use check.*fa check"
        ):
            out = fa_attn.flash_attn_func(q, k, v, causal=True)
        route = fa_attn.last_dispatch()
        assert route is not None, route
        assert route.path == "fallback", route
        (reason,) = route.reasons
        assert reason.code == "self-check-failed"
        assert "out: error" in reason.message, reason.message
        assert "bound" in reason.message, reason.message
        assert torch.equal(out, expected)
        launched = len(emulated.LAUNCHED)
        with warnings.catch_warnings():
            warnings.simplefilter("error", selfcheck.FaSelfCheckWarning)  # one warning per unit
            again = fa_attn.flash_attn_func(q, k, v, causal=True)
        assert torch.equal(again, expected)
        assert len(emulated.LAUNCHED) == launched, "the failed unit ran again"
    selfcheck.reset()


@pytest.mark.usefixtures("real_path")
def test_a_healthy_unit_passes_its_check_once_then_serves() -> None:
    q, k, v = qkv()
    fa_attn.flash_attn_func(q, k, v, causal=True)
    route = fa_attn.last_dispatch()
    assert route is not None, route
    assert route.path == "sass", route
    assert route.verified == "self-check", route
    assert len(emulated.LAUNCHED) == 2  # the check's small problem, then the call (which does not split)
    fa_attn.flash_attn_func(q, k, v, causal=True)
    assert len(emulated.LAUNCHED) == 3  # no second check


@pytest.mark.usefixtures("real_path")
@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
def test_records_decide_without_a_check() -> None:
    q, k, v = qkv()
    unit = fwd_unit()
    write_record(unit, records.UnitResult("pass", max_err=1e-3, bound=2e-3))
    fa_attn.flash_attn_func(q, k, v, causal=True)
    route = fa_attn.last_dispatch()
    assert route is not None, route
    assert route.verified == "record", route
    assert len(emulated.LAUNCHED) == 1  # the call only

    write_record(unit, records.UnitResult("fail", "dq: error 0.5 > bound 0.004", 0.5, 0.004))
    with pytest.warns(selfcheck.FaSelfCheckWarning, match=unit):
        out = fa_attn.flash_attn_func(q, k, v, causal=True)
    route = fa_attn.last_dispatch()
    assert route is not None, route
    assert route.reasons[0].code == "self-check-failed", route
    assert "`fa check`" in route.reasons[0].message
    assert torch.equal(out, sdpa_output(q, k, v))


@pytest.mark.usefixtures("real_path")
@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
def test_routing_follows_recorded_speed(monkeypatch) -> None:
    q, k, v = qkv()
    unit = fwd_unit()
    write_record(unit, records.UnitResult("pass", speed={"fwd-causal": {"32": 1.4, "4096": 0.6}}))
    fa_attn.flash_attn_func(q, k, v, causal=True)  # 40 keys: nearest measured length is 32
    route = fa_attn.last_dispatch()
    assert route is not None, route
    assert route.path == "fallback", route
    assert route.reasons[0].code == "slower-than-sdpa"
    assert "1.40x" in route.reasons[0].message

    monkeypatch.setenv("FA_ROUTE", "fa")
    fa_attn.flash_attn_func(q, k, v, causal=True)
    assert fa_attn.last_dispatch().path == "sass"  # type: ignore[union-attr]

    monkeypatch.setenv("FA_ROUTE", "auto")
    write_record(unit, records.UnitResult("pass", speed={"fwd-causal": {"32": 0.7}}))
    fa_attn.flash_attn_func(q, k, v, causal=True)
    assert fa_attn.last_dispatch().path == "sass"  # type: ignore[union-attr]


@pytest.mark.usefixtures("real_path")
@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
def test_under_graph_capture_no_check_runs_and_it_shows(monkeypatch) -> None:
    q, k, v = qkv()
    monkeypatch.setattr(selfcheck, "in_capture", lambda _device: True)  # the GPU's capture state: mocked
    fa_attn.flash_attn_func(q, k, v, causal=True)
    route = fa_attn.last_dispatch()
    assert route is not None, route
    assert route.path == "sass", route
    assert route.verified == "unchecked", route
    assert len(emulated.LAUNCHED) == 1  # the call, no check
    assert fa_attn.explain(q, k, v, causal=True).verified == "unchecked"

    monkeypatch.setenv("FA_SELF_CHECK", "strict")
    fa_attn.flash_attn_func(q, k, v, causal=True)
    route = fa_attn.last_dispatch()
    assert route is not None, route
    assert route.reasons[0].code == "not-verified", route


def test_bad_settings_are_named(monkeypatch) -> None:
    monkeypatch.setenv("FA_SELF_CHECK", "sometimes")
    with pytest.raises(ValueError, match=r"FA_SELF_CHECK='sometimes'.*first-use, strict, off"):
        selfcheck.mode()
    monkeypatch.setenv("FA_ROUTE", "sdpa-always")
    with pytest.raises(ValueError, match=r"FA_ROUTE='sdpa-always'"):
        selfcheck.route_mode()


def test_records_round_trip_atomically(tmp_path: Path) -> None:
    key = records.RecordKey("ab" * 32, "NVIDIA A100", "8.0", "575.51.03", "2.13.0")
    result = records.UnitResult(
        "fail", "out: error 1 > bound 0.1", 1.0, 0.1, {"fwd": {"512": 0.9, "8192": 1.2}}
    )
    path = records.write(
        records.Record(key, "2026-11-25T03:00:00Z", "fa check", {"sm_80/u": result}), tmp_path
    )
    assert [p.name for p in tmp_path.iterdir() if p.name != ".lock"] == [path.name]  # no temporary left
    back = records.read(key, tmp_path)
    assert back is not None
    assert back.units == {"sm_80/u": result}
    assert records.speed_ratio(result, "fwd", 6000) == 1.2
    assert records.speed_ratio(result, "bwd", 512) is None
    assert (
        records.read(records.RecordKey("cd" * 32, "NVIDIA A100", "8.0", "575.51.03", "2.13.0"), tmp_path)
        is None
    )
    path.write_text("{damaged")
    with pytest.warns(records.RecordWarning, match="ignores all"):
        assert records.read(key, tmp_path) is None


# ---- torch.compile and graph capture on the real path ----------------------------------------------


@pytest.fixture
def real_path(monkeypatch, tmp_path):
    """The runtime's own decision (interface._decide_for, dispatch.decide) and admission; faked only the
    device, where the runtime reads it (dispatch.facts_for answers an sm 8.0 GPU for CPU tensors, its SM
    count emulated.SM_COUNT), and the binding (loaded; a manifest of sm 8.0 SASS; the fa_attn ops run
    the kernels on the emulator)."""

    def gpu_facts(_type, _index, dtype, head_dim, backward, features, page_size=0):
        call = fa_attn.decision.Call(dtype, head_dim, backward, features, page_size)
        return dispatch.CallFacts(fa_attn.decision.Device("cuda", emulated.ARCH), call)

    monkeypatch.setattr(dispatch, "facts_for", gpu_facts)
    monkeypatch.setattr(fa_attn.loader, "manifest", emulated.manifest)
    monkeypatch.setattr(fa_attn.loader, "load_binding", lambda: None)
    monkeypatch.setattr(interface, "_sm_count", lambda _device: emulated.SM_COUNT)
    for memo in ("_decisions", "_kept_routes", "_kept_args"):
        monkeypatch.setattr(interface, memo, {})
    monkeypatch.setattr(selfcheck, "key_of", emulated.gpu_key)
    monkeypatch.setenv("FA_SELF_CHECK", "first-use")
    monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path / "records"))
    monkeypatch.delenv("FA_ROUTE", raising=False)
    selfcheck.reset()
    torch._dynamo.reset()
    with emu_ops.kernels_on_cpu(emulated._emulated):
        yield
    selfcheck.reset()
    torch._dynamo.reset()


def public_calls() -> dict[str, tuple]:
    """Every public function of flash-attn's API, with tiny fp16 arguments the kernels serve."""
    b, s, h, d = SHAPE
    gen = torch.Generator().manual_seed(3)

    def t(*shape):
        return torch.randn(*shape, generator=gen).half()

    cu = torch.tensor([0, 17, 40], dtype=torch.int32)
    return {
        "flash_attn_func": (fa_attn.flash_attn_func, (t(b, s, h, d), t(b, s, h, d), t(b, s, h, d)), {"causal": True}),
        "flash_attn_qkvpacked_func": (fa_attn.flash_attn_qkvpacked_func, (t(b, s, 3, h, d),), {}),
        "flash_attn_kvpacked_func": (fa_attn.flash_attn_kvpacked_func, (t(b, s, h, d), t(b, s, 2, h, d)), {}),
        "flash_attn_varlen_func": (
            fa_attn.flash_attn_varlen_func, (t(s, h, d), t(s, h, d), t(s, h, d), cu, cu, 23, 23), {"causal": True}
        ),
        "flash_attn_varlen_qkvpacked_func": (fa_attn.flash_attn_varlen_qkvpacked_func, (t(s, 3, h, d), cu, 23), {}),
        "flash_attn_varlen_kvpacked_func": (
            fa_attn.flash_attn_varlen_kvpacked_func, (t(s, h, d), t(s, 2, h, d), cu, cu, 23, 23), {}
        ),
        "flash_attn_with_kvcache": (
            fa_attn.flash_attn_with_kvcache, (t(2, 1, h, d), t(2, s, h, d), t(2, s, h, d)),
            {"cache_seqlens": torch.tensor([40, 29], dtype=torch.int32)},
        ),
    }  # fmt: skip


@pytest.mark.usefixtures("real_path")
@pytest.mark.parametrize("name", list(public_calls()))
def test_compile_fullgraph_on_the_kernel_route_with_the_runtimes_own_admission(name) -> None:
    fn, args, kwargs = public_calls()[name]
    eager = fn(*args, **kwargs)  # the first eager call checks the call's units
    route = fa_attn.last_dispatch()
    assert route is not None
    assert (route.path, route.verified) == ("sass", "self-check"), route
    launched = len(emulated.LAUNCHED)
    compiled = torch.compile(lambda *a: fn(*a, **kwargs), fullgraph=True, backend="aot_eager")
    got = compiled(*args)  # fullgraph: a graph break, or a host read of a tensor, raises
    assert torch.equal(got, eager)
    assert len(emulated.LAUNCHED) == launched + 1, emulated.LAUNCHED[launched:]  # the call; no check
    assert emulated.LAUNCHED[-1][0] in ("fwd", "fwd_splitkv")


@pytest.mark.usefixtures("real_path")
def test_compile_fullgraph_backward_on_the_kernel_route() -> None:
    q, k, v = (t.requires_grad_() for t in qkv())

    def loss(q, k, v):
        return fa_attn.flash_attn_func(q, k, v, causal=True).float().square().sum()

    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    assert fa_attn.last_dispatch().verified == "self-check"  # type: ignore[union-attr]
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    for got, want in zip(torch.autograd.grad(compiled(q, k, v), (q, k, v)), eager, strict=True):
        assert torch.equal(got, want)


@pytest.mark.usefixtures("real_path")
@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
def test_under_torch_compile_records_decide_and_no_check_runs(monkeypatch) -> None:
    q, k, v = qkv()

    def compiled():
        torch._dynamo.reset()
        return torch.compile(lambda q, k, v: fa_attn.flash_attn_func(q, k, v, causal=True), fullgraph=True)

    compiled()(q, k, v)
    assert emulated.LAUNCHED == [("fwd", 1)]  # the call ran on the kernels, and no check ran
    assert fa_attn.explain(q, k, v, causal=True).verified == "unchecked"

    monkeypatch.setenv("FA_SELF_CHECK", "strict")
    assert torch.equal(compiled()(q, k, v), fallback_output(q, k, v, causal=True))  # nothing verified
    assert emulated.LAUNCHED == [("fwd", 1)]

    monkeypatch.setenv("FA_SELF_CHECK", "first-use")
    write_record(fwd_unit(), FAIL)
    assert torch.equal(compiled()(q, k, v), fallback_output(q, k, v, causal=True))
    assert emulated.LAUNCHED == [("fwd", 1)]  # the failed unit was compiled out


@pytest.mark.usefixtures("real_path")
@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
def test_under_graph_capture_a_checked_class_serves_and_a_new_one_runs_unchecked(monkeypatch) -> None:
    q, k, v = qkv()
    fa_attn.flash_attn_func(q, k, v, causal=True)  # before capture: checked
    monkeypatch.setattr(selfcheck, "in_capture", lambda _device: True)  # the device's capture state
    launched = len(emulated.LAUNCHED)
    fa_attn.flash_attn_func(q, k, v, causal=True)
    assert fa_attn.last_dispatch().verified == "self-check"  # type: ignore[union-attr]
    fa_attn.flash_attn_func(q, k, v)  # a class never checked: no check can run inside capture
    assert fa_attn.last_dispatch().verified == "unchecked"  # type: ignore[union-attr]
    assert len(emulated.LAUNCHED) == launched + 2  # the two calls, no check
    monkeypatch.setenv("FA_SELF_CHECK", "strict")
    fa_attn.flash_attn_func(q, k, v)
    assert fa_attn.last_dispatch().reasons[0].code == "not-verified"  # type: ignore[union-attr]


# ---- admission per class: a unit serves a call only of a class its check covered ---------------------


def healthy_then(monkeypatch, fault, **call) -> tuple[torch.Tensor, torch.Tensor]:
    """A plain call (non-causal, head dim 32, 2/2 heads) passes its check and serves; then `fault`
    breaks the emulated forward for calls like `call` only, and such a call runs. (its output, SDPA's)"""
    q, k, v = qkv()
    fa_attn.flash_attn_func(q, k, v)
    assert fa_attn.last_dispatch().verified == "self-check"  # type: ignore[union-attr]
    head_dim, heads_k = call.pop("head_dim", SHAPE[3]), call.pop("heads_k", SHAPE[2])
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(SHAPE[0], SHAPE[1], call.pop("heads", SHAPE[2]), head_dim, generator=gen).half()
    k, v = (torch.randn(SHAPE[0], SHAPE[1], heads_k, head_dim, generator=gen).half() for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fa_attn.FaFallbackWarning)
        warnings.simplefilter("ignore", selfcheck.FaSelfCheckWarning)
        expected = fa_attn.fallback.attention(
            fa_attn.inputs.check_padded(q, k, v, 0.0, None, call.get("causal", False), (-1, -1), 0.0, None,
                                        False), q, k, v, want_lse=False,
        )[0]  # fmt: skip
        healthy = emulated.H.forward
        monkeypatch.setattr(emulated.H, "forward", lambda lib, c: fault(healthy, lib, c))
        out = fa_attn.flash_attn_func(q, k, v, **call)
    return out, expected


def causal_only(healthy, lib, c):  # right unless the mask is causal
    out, lse = healthy(lib, c)
    return (out * 1.1 if c.causal else out), lse


def default_scale(healthy, lib, c):  # the caller's softmax_scale ignored: 1/sqrt(the unit's head dim)
    return healthy(lib, dataclasses.replace(c, softmax_scale=c.q.shape[-1] ** -0.5))


def head_modulo(healthy, lib, c):  # query head h reads key head h % h_k, not h // group
    heads, heads_k = c.q.shape[-2], c.k.shape[-2]
    rows = torch.arange(heads) % heads_k
    return healthy(
        lib, dataclasses.replace(c, k=c.k[:, :, rows].contiguous(), v=c.v[:, :, rows].contiguous())
    )


@pytest.mark.usefixtures("real_path")
@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
@pytest.mark.parametrize(
    ("fault", "call"),
    [
        (causal_only, {"causal": True}),
        (default_scale, {"head_dim": 24}),  # on the d32 unit
        (head_modulo, {"heads": 4, "heads_k": 2}),
    ],
    ids=["causal-after-non-causal", "head-dim-24-on-d32", "gqa-4-2"],
)
def test_a_call_of_a_class_never_checked_is_checked_first(monkeypatch, fault, call) -> None:
    out, expected = healthy_then(monkeypatch, fault, **call)
    route = fa_attn.last_dispatch()
    assert route is not None
    assert route.path == "fallback", route
    assert route.reasons[0].code == "self-check-failed", route
    assert torch.equal(out, expected)


def test_each_class_gets_a_problem_of_its_own() -> None:
    launch = fa_attn.decision.KernelLaunch("/k/sm_80/fwd_fp16_d64.cubin", "fa_fwd", (64, 128, 128, 64, 0, 0))
    base = selfcheck.CallClass(False, "none", False, "padded", 0, 1, False, 64)
    p = selfcheck.problem_for("fwd", launch, torch.float16, base)
    assert (p.seqlen_q, p.seqlen_k, p.heads, p.heads_k, p.window, p.softcap) == (79, 79, 2, 2, (-1, -1), 0.0)
    assert not math.isclose(p.scale, 64**-0.5), "the default scale would hide a kernel that ignores it"
    p = selfcheck.problem_for(
        "fwd", launch, torch.float16, base._replace(group=4, head_dim=40, window="both")
    )
    assert (p.heads, p.heads_k, p.head_dim, p.window) == (8, 2, 40, (19, 15))
    p = selfcheck.problem_for("fwd", launch, torch.float16, base._replace(group=8, mqa=True, softcap=True))
    assert (p.heads, p.heads_k, p.softcap) == (8, 1, selfcheck.SOFTCAP)
    p = selfcheck.problem_for("fwd", launch, torch.float16, base._replace(layout="kvcache", page_size=64))
    assert (p.layout, p.page_size) == ("paged", 64)
    p = selfcheck.problem_for("splitkv", launch, torch.float16, base)
    assert p.seqlen_q == 129, "two query blocks meet two splits in the combine"


def decode_qkv(keys: int = 300) -> tuple[torch.Tensor, ...]:
    """One query over enough keys that flash_attn_func's heuristic splits them (emulated.SM_COUNT)."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 1, 2, 32, generator=gen).half()
    return (q, *(torch.randn(1, keys, 2, 32, generator=gen).half() for _ in range(2)))


@pytest.mark.usefixtures("real_path")
@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
def test_split_kv_is_admitted_like_any_unit() -> None:
    q, k, v = decode_qkv()
    route = fa_attn.explain(q, k, v)
    assert route.splitkv is not None, route
    split = records.unit_name(route.splitkv.module)
    write_record(split, records.UnitResult("fail", "out: error 0.5 > bound 0.004", 0.5, 0.004))
    with pytest.warns(selfcheck.FaSelfCheckWarning, match=split):
        out = fa_attn.flash_attn_func(q, k, v)
    route = fa_attn.last_dispatch()
    assert route is not None
    assert route.path == "sass", route  # the forward serves the call ...
    assert route.splitkv is None, route
    assert ("fwd_splitkv", 2) not in emulated.LAUNCHED, emulated.LAUNCHED  # ... unsplit
    assert emulated.LAUNCHED[-1] == ("fwd", 1)
    torch.testing.assert_close(out, fallback_output(q, k, v), atol=2e-3, rtol=0)


def fallback_output(q, k, v, causal: bool = False) -> torch.Tensor:
    """What fa's fallback (torch SDPA) gives for the call, asked directly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fa_attn.FaFallbackWarning)
        call = fa_attn.inputs.check_padded(q, k, v, 0.0, None, causal, (-1, -1), 0.0, None, False)
        return fa_attn.fallback.attention(call, q, k, v, want_lse=False)[0]


@pytest.mark.usefixtures("real_path")
def test_a_split_call_checks_the_split_kv_unit_first() -> None:
    q, k, v = decode_qkv()
    fa_attn.flash_attn_func(q, k, v)
    assert emulated.LAUNCHED[0][0] == "fwd_splitkv", emulated.LAUNCHED  # its check, before the call
    assert emulated.LAUNCHED[-1][0] == "fwd_splitkv", emulated.LAUNCHED  # the call, split
    assert fa_attn.last_dispatch().verified == "self-check"  # type: ignore[union-attr]


# ---- what a check runs under, and errors that are not the kernel's ---------------------------------


@pytest.mark.usefixtures("real_path")
def test_checks_ignore_the_callers_autocast_and_default_device() -> None:
    q, k, v = (t.bfloat16() for t in qkv())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fa_attn.flash_attn_func(q, k, v, causal=True)
    assert fa_attn.last_dispatch().verified == "self-check", fa_attn.last_dispatch()  # type: ignore[union-attr]
    selfcheck.reset()
    torch.set_default_device("meta")
    try:
        fa_attn.flash_attn_func(q, k, v)
    finally:
        torch.set_default_device(None)
    assert fa_attn.last_dispatch().verified == "self-check", fa_attn.last_dispatch()  # type: ignore[union-attr]


@pytest.mark.usefixtures("real_path")
@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
def test_out_of_memory_during_a_check_disables_nothing(monkeypatch) -> None:
    q, k, v = qkv()
    healthy, failures = emulated.H.forward, [1]

    def short_of_memory(lib, c):  # the first launch finds the GPU full; later ones run
        if failures:
            failures.pop()
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return healthy(lib, c)

    monkeypatch.setattr(emulated.H, "forward", short_of_memory)
    with warnings.catch_warnings():
        warnings.simplefilter("error", selfcheck.FaSelfCheckWarning)  # nothing blames the kernel
        fa_attn.flash_attn_func(q, k, v, causal=True)
        route = fa_attn.last_dispatch()
        assert route is not None
        assert route.reasons[0].code == "not-verified", route
        assert "out of memory" in route.reasons[0].message, route
        monkeypatch.setattr(selfcheck, "RETRY_S", 0.0)
        fa_attn.flash_attn_func(q, k, v, causal=True)
    route = fa_attn.last_dispatch()
    assert route is not None
    assert (route.path, route.verified) == ("sass", "self-check"), route


# ---- records are evidence ------------------------------------------------------------------------


def raw_record(unit: str, entry: dict) -> Path:
    key = emulated.gpu_key(torch.device("cpu"))
    path = records.write(records.Record(key, "2026-11-25T03:00:00Z", "fa check", {}))
    data = json.loads(path.read_text())
    data["units"][unit] = entry
    path.write_text(json.dumps(data))
    selfcheck.reset()
    return path


@pytest.mark.usefixtures("real_path")
@pytest.mark.parametrize(
    "entry",
    [
        {"verdict": "pass", "max_err": 0.5, "bound": 0.004},
        {"verdict": "pass", "max_err": math.nan, "bound": 0.004},
        {"verdict": "pass", "max_err": math.inf, "bound": math.inf},
    ],
    ids=["above-bound", "nan", "inf"],
)
def test_a_pass_counts_only_when_its_numbers_say_pass(entry) -> None:
    q, k, v = qkv()
    raw_record(fwd_unit(), entry)
    fa_attn.flash_attn_func(q, k, v, causal=True)
    assert fa_attn.last_dispatch().verified == "self-check", fa_attn.last_dispatch()  # type: ignore[union-attr]


@pytest.mark.usefixtures("real_path")
def test_a_record_others_can_write_is_ignored() -> None:
    q, k, v = qkv()
    path = raw_record(fwd_unit(), {"verdict": "pass", "max_err": 0.001, "bound": 0.004})
    path.chmod(0o666)
    with pytest.warns(records.RecordWarning, match="writable"):
        fa_attn.flash_attn_func(q, k, v, causal=True)
    assert fa_attn.last_dispatch().verified == "self-check", fa_attn.last_dispatch()  # type: ignore[union-attr]


@pytest.mark.usefixtures("real_path")
@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
def test_a_record_of_another_user_is_ignored() -> None:
    q, k, v = qkv()
    path = raw_record(fwd_unit(), {"verdict": "pass", "max_err": 0.001, "bound": 0.004})
    os.chown(path, 4242, 4242)
    with pytest.warns(records.RecordWarning, match="4242"):
        fa_attn.flash_attn_func(q, k, v, causal=True)
    assert fa_attn.last_dispatch().verified == "self-check", fa_attn.last_dispatch()  # type: ignore[union-attr]


@pytest.mark.usefixtures("real_path")
def test_a_malformed_speed_key_is_ignored_with_one_warning() -> None:
    q, k, v = qkv()
    entry = {"verdict": "pass", "max_err": 0.001, "bound": 0.004, "speed": {"fwd-causal": {"40k": 1.5}}}
    raw_record(fwd_unit(), entry)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fa_attn.flash_attn_func(q, k, v, causal=True)
        selfcheck.reset()
        fa_attn.flash_attn_func(q, k, v, causal=True)
    (warned,) = [w for w in seen if issubclass(w.category, records.RecordWarning)]
    assert "speed entry 'fwd-causal'/'40k'" in str(warned.message), warned
    route = fa_attn.last_dispatch()
    assert route is not None
    assert (route.path, route.verified) == ("sass", "record"), route


@pytest.mark.usefixtures("real_path")
@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
def test_speed_routes_only_the_class_it_was_measured_on() -> None:
    q, k, v = qkv()
    unit = fwd_unit()
    write_record(unit, records.UnitResult("pass", speed={"fwd": {"32": 1.4}}))  # non-causal, sq = sk
    fa_attn.flash_attn_func(q, k, v, causal=True)
    assert fa_attn.last_dispatch().path == "sass"  # type: ignore[union-attr]
    fa_attn.flash_attn_func(q[:, :1], k, v)  # a decode step
    assert fa_attn.last_dispatch().path == "sass"  # type: ignore[union-attr]
    fa_attn.flash_attn_func(q, k, v)
    assert fa_attn.last_dispatch().reasons[0].code == "slower-than-sdpa"  # type: ignore[union-attr]
    write_record(unit, records.UnitResult("pass", speed={"fwd-decode": {"32": 1.4}}))
    fa_attn.flash_attn_func(q[:, :1], k, v)
    assert fa_attn.last_dispatch().reasons[0].code == "slower-than-sdpa"  # type: ignore[union-attr]


def test_two_gpus_of_one_model_keep_two_verdicts(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path))

    class Props:  # what the CUDA driver says of two A100s (torch's device properties)
        name, major, minor = "NVIDIA A100-SXM4-80GB", 8, 0

        def __init__(self, index: int) -> None:
            self.uuid = f"GPU-0000000{index}-1111-2222-3333-444444444444"

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Props(torch.device(d).index))
    gpu0, gpu1 = (selfcheck.record_key(torch.device("cuda", i)) for i in (0, 1))
    assert gpu0 != gpu1
    assert gpu0.uuid == "00000000-1111-2222-3333-444444444444"
    records.write(records.Record(gpu0, "2026-11-25T03:00:00Z", "fa check", {"sm_80/u": FAIL}))
    records.write(records.Record(gpu1, "2026-11-25T03:00:01Z", "fa check", {"sm_80/u": PASS}))
    assert not records.read(gpu0).units["sm_80/u"].passed  # type: ignore[union-attr]
    assert records.read(gpu1).units["sm_80/u"].passed  # type: ignore[union-attr]


PASS = records.UnitResult("pass", max_err=1e-3, bound=4e-3)
FAIL = records.UnitResult("fail", "out: error 0.5 > bound 0.004", 0.5, 0.004)


def test_records_merge_under_a_lock(monkeypatch, tmp_path: Path) -> None:
    key = records.RecordKey("ab" * 32, "NVIDIA A100", "8.0", "575.51.03", "2.13.0", "u-1")
    records.write(records.Record(key, "2026-11-25T03:00:00Z", "fa check", {"sm_80/a": FAIL}), tmp_path)
    records.write(records.Record(key, "2026-11-25T03:00:09Z", "fa check", {"sm_80/b": PASS}), tmp_path)
    back = records.read(key, tmp_path)
    assert back is not None
    assert back.units == {"sm_80/a": FAIL, "sm_80/b": PASS}, "a later check of other units kept the first's"
    monkeypatch.setattr(records, "LOCK_TIMEOUT_S", 0.2)
    late = records.Record(key, "2026-11-25T03:00:10Z", "fa check", {"sm_80/a": PASS})
    with fa_attn.ownfiles.locked(tmp_path / ".lock", timeout=1.0), pytest.raises(fa_attn.ownfiles.Refused):
        records.write(late, tmp_path)  # another writer holds the lock: nothing is overwritten
    assert records.read(key, tmp_path).units["sm_80/a"] == FAIL  # type: ignore[union-attr]


def test_fa_check_bench_times_every_speed_class_the_runtime_routes_by() -> None:
    from fa_attn.verify import speed

    for direction in ("fwd", "splitkv", "bwd"):
        timed = {key for key, _causal, _decode in speed.speed_classes(direction)}
        routed = {
            records.speed_key("bwd" if direction == "bwd" else "fwd", causal, decode)
            for causal in (False, True)
            for decode in (False, True)
        }
        assert timed == routed, direction


@pytest.mark.parametrize("hazard", ["symlink", "fifo", "dev-zero", "deep", "folder", "oversized"])
def test_a_record_that_is_not_a_plain_small_file_is_ignored_without_hanging(tmp_path: Path, hazard) -> None:
    key = records.RecordKey("ab" * 32, "NVIDIA A100", "8.0", "575.51.03", "2.13.0", "u-1")
    folder = tmp_path / "records"
    elsewhere = records.write(
        records.Record(key, "2026-11-25T03:00:00Z", "fa check", {"sm_80/a": PASS}), tmp_path
    )
    folder.mkdir()
    path = folder / key.file_name()
    if hazard == "symlink":  # a record that would pass, reached through a link
        path.symlink_to(elsewhere)
    elif hazard == "fifo":
        os.mkfifo(path)
    elif hazard == "dev-zero":
        path.symlink_to("/dev/zero")
    elif hazard == "deep":
        path.write_text("[" * 100_000)
    elif hazard == "folder":
        path.mkdir()
    else:
        path.write_bytes(b" " * (records.RECORD_LIMIT + 1))
    with pytest.warns(records.RecordWarning, match=r"ignores all"):
        assert records.read(key, folder) is None
