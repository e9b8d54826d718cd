"""The runtime never uses a kernel that failed where it runs (fa_attn.selfcheck), on the emulated kernels.

A fault is injected into one unit's results through the emulated-kernel path (tests/api/emulated.py):
the first-use self-check must catch it, the call and later ones fall back with `self-check-failed` and
give SDPA's output exactly. Records of `fa check` decide instead of a check, speed ratios in them route
to SDPA (`slower-than-sdpa`) unless FA_ROUTE=fa, and where no check can run (graph capture) the call runs
unchecked and says so, or falls back under FA_SELF_CHECK=strict. The GPU is the only mock.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import emu_harness
import emulated
import fa_attn
import pytest
import torch
from emulated import kernels_on_cpu
from fa_attn import selfcheck
from fa_attn.verify import record as records

pytestmark = pytest.mark.skipif(
    emu_harness.cxx() is None, reason="the kernel emulator needs a host C++ compiler (g++)"
)

SHAPE = (1, 40, 2, 32)  # batch, seqlen, heads, head dim: tiny


@pytest.fixture
def kernels(monkeypatch, tmp_path):
    with kernels_on_cpu(monkeypatch):
        monkeypatch.setenv("FA_SELF_CHECK", "first-use")
        monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path / "records"))
        monkeypatch.delenv("FA_ROUTE", raising=False)
        yield
    selfcheck.reset()


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


@pytest.mark.usefixtures("kernels")
def test_a_healthy_unit_passes_its_check_once_then_serves() -> None:
    q, k, v = qkv()
    fa_attn.flash_attn_func(q, k, v, causal=True)
    route = fa_attn.last_dispatch()
    assert route is not None, route
    assert route.path == "sass", route
    assert route.verified == "self-check", route
    assert len(emulated.LAUNCHED) == 2  # the check's tiny problem, then the call
    fa_attn.flash_attn_func(q, k, v, causal=True)
    assert len(emulated.LAUNCHED) == 3  # no second check


@pytest.mark.usefixtures("kernels")
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


@pytest.mark.usefixtures("kernels")
@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
def test_routing_follows_recorded_speed(monkeypatch) -> None:
    q, k, v = qkv()
    unit = fwd_unit()
    write_record(unit, records.UnitResult("pass", speed={"fwd": {"32": 1.4, "4096": 0.6}}))
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
    write_record(unit, records.UnitResult("pass", speed={"fwd": {"32": 0.7}}))
    fa_attn.flash_attn_func(q, k, v, causal=True)
    assert fa_attn.last_dispatch().path == "sass"  # type: ignore[union-attr]


@pytest.mark.usefixtures("kernels")
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
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
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
    assert records.read(key, tmp_path) is None


@pytest.mark.usefixtures("kernels")
@pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")
@pytest.mark.filterwarnings("ignore::fa_attn.selfcheck.FaSelfCheckWarning")
@pytest.mark.filterwarnings("ignore::UserWarning:torch._dynamo")
def test_under_torch_compile_records_decide_and_no_check_runs() -> None:
    q, k, v = qkv()
    unit = fwd_unit()
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: fa_attn.flash_attn_func(q, k, v, causal=True), backend="eager")
    compiled(q, k, v)
    assert emulated.LAUNCHED == [("fwd", 1)]  # the call ran on the kernels, and no check ran
    assert fa_attn.explain(q, k, v, causal=True).verified == "unchecked"

    write_record(unit, records.UnitResult("fail", "out: error 0.5 > bound 0.004", 0.5, 0.004))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: fa_attn.flash_attn_func(q, k, v, causal=True), backend="eager")
    assert torch.equal(compiled(q, k, v), sdpa_output(q, k, v))
    assert emulated.LAUNCHED == [("fwd", 1)]  # the failed unit was compiled out
    torch._dynamo.reset()
