"""The first-use self-check on the real kernels, run by tests/emu's CPU emulator (emulated.py): an image is
checked once before its first call, a faulty one is never used (its calls give SDPA's answer, with the
reason), a record from an earlier process or `fa check` is honoured, speed ratios route calls, and under
torch.compile the unverified image is not used (selfcheck.py's documented rule)."""

from __future__ import annotations

from pathlib import Path

import emulated
import pytest
import torch
from fa_attn import check_record, decision, fallback, interface, selfcheck
from fa_attn.decision import Call, Device
from fa_attn.dispatch import CallFacts, decide, last_dispatch
from fa_attn.interface import flash_attn_func

DIM = 64  # one head-dim bucket: every test checks the same two images (fwd fp16 d64, its backward)


@pytest.fixture
def kernels(monkeypatch, tmp_path):
    """The emulated kernels behind the real decide -> self-check path, with a record folder of the
    test's own and image files (the record keys an image by its bytes) under tmp_path."""
    monkeypatch.setenv(check_record.ENV_DIR, str(tmp_path / "records"))
    monkeypatch.delenv("FA_SELF_CHECK", raising=False)
    monkeypatch.delenv("FA_ROUTE", raising=False)
    package = tmp_path / "package"
    manifest = emulated.manifest()
    for kernel in manifest.kernels:
        path = package / kernel.file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"emulated image of {kernel.unit}".encode())

    def reach(_device_type, _device_index, dtype, head_dim, backward, features, page_size):
        facts = CallFacts(
            Device("cuda", emulated.ARCH), Call(dtype, head_dim, backward, frozenset(features), page_size)
        )
        return decide(facts, manifest, lambda: None, driver=lambda: None, package_dir=package)

    with emulated.kernels_on_cpu(monkeypatch):
        monkeypatch.setattr(interface, "decide", _real_decide)  # kernels_on_cpu replaces it; keep the gate
        monkeypatch.setattr(interface, "reach", reach)
        interface._decisions.clear()
        selfcheck.forget()
        yield package
    interface._decisions.clear()
    selfcheck.forget()


_real_decide = interface.decide


def _qkv(seqlen_k: int = 40, grad: bool = False) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    shapes = ((1, 24, 2, DIM), (1, seqlen_k, 2, DIM), (1, seqlen_k, 2, DIM))
    return tuple(torch.randn(s, generator=gen).half().requires_grad_(grad) for s in shapes)


def _image(package: Path, direction: str = "fwd") -> Path:
    return next(package.rglob(f"{direction}_fp16_d{DIM}.cubin"))


def test_an_image_is_checked_once_before_its_first_call(kernels) -> None:
    q, k, v = _qkv()
    flash_attn_func(q, k, v)
    first = last_dispatch()
    assert first is not None
    assert first.path == "sass"
    assert first.verified == selfcheck.FIRST_USE
    checks = len(emulated.LAUNCHED) - 1  # the tiny problems, then the call itself
    units = selfcheck.units_of(first, backward=False)
    assert [u.direction for u in units] == ["fwd", "splitkv"]  # a forward call may take either
    assert checks == 4  # two tiny problems per image
    assert emulated.LAUNCHED[:checks] == [("fwd", 1), ("fwd", 1), ("fwd_splitkv", 2), ("fwd_splitkv", 2)]
    flash_attn_func(q, k, v)
    assert len(emulated.LAUNCHED) == checks + 2  # the second call runs no check
    record = check_record.read(selfcheck.machine_of(q.device))
    entry = record[check_record.image_sha256(_image(kernels))]
    assert entry.passed
    assert entry.unit == f"fwd_fp16_d{DIM}"
    assert entry.max_error is not None
    assert entry.max_error <= 1.0


@pytest.mark.usefixtures("kernels")
def test_a_faulty_image_is_never_used_and_its_calls_give_sdpas_answer(monkeypatch) -> None:
    honest = emulated.H.forward

    def off_by_a_little(unit, call):  # a kernel whose outputs are wrong by 1e-2: beyond the rule's bound
        out, lse = honest(unit, call)
        return out + 1e-2, lse

    monkeypatch.setattr(emulated.H, "forward", off_by_a_little)
    q, k, v = _qkv()
    with pytest.warns(selfcheck.FaSelfCheckWarning, match=f"fwd_fp16_d{DIM}"):
        out = flash_attn_func(q, k, v)
    route = last_dispatch()
    assert route is not None
    assert route.path == "fallback"
    assert [r.code for r in route.reasons] == ["self-check-failed"]
    assert "bound" in route.reasons[0].message
    call = interface.inputs.check_padded(q, k, v, 0.0, None, False, (-1, -1), 0.0, None, False)
    expected, _ = fallback.attention(call, q, k, v, False)
    assert torch.equal(out, expected)
    launched = len(emulated.LAUNCHED)
    flash_attn_func(q, k, v)  # never used again in this process: no launch, no second check
    assert len(emulated.LAUNCHED) == launched


def test_a_failing_record_from_an_earlier_process_is_honoured(kernels) -> None:
    q, k, v = _qkv()
    failed = check_record.UnitResult.now(
        unit=f"fwd_fp16_d{DIM}",
        image="sass",
        passed=False,
        max_error=3.5,
        detail="out: max error 0.1",
        by="fa check",
    )
    check_record.write(selfcheck.machine_of(q.device), {check_record.image_sha256(_image(kernels)): failed})
    with pytest.warns(selfcheck.FaSelfCheckWarning):
        flash_attn_func(q, k, v)
    route = last_dispatch()
    assert route is not None
    assert [r.code for r in route.reasons] == ["self-check-failed"]
    assert emulated.LAUNCHED == []  # the record answered: nothing ran


def test_the_backward_image_is_checked_when_a_call_needs_gradients(kernels) -> None:
    q, k, v = _qkv(grad=True)
    out = flash_attn_func(q, k, v)
    out.sum().backward()
    route = last_dispatch()
    assert route is not None
    assert route.path == "sass"
    record = check_record.read(selfcheck.machine_of(q.device))
    assert record[check_record.image_sha256(_image(kernels, "bwd"))].passed


def test_recorded_speed_routes_slow_lengths_to_sdpa_unless_forced(kernels, monkeypatch) -> None:
    q, k, v = _qkv(seqlen_k=40)
    machine = selfcheck.machine_of(q.device)
    slow_short = check_record.UnitResult.now(
        unit=f"fwd_fp16_d{DIM}", image="sass", passed=True, max_error=0.2, detail="", by="fa check",
        speed={"fwd <=512": 1.4, "fwd <=2048": 0.7},
    )  # fmt: skip
    check_record.write(machine, {check_record.image_sha256(_image(kernels)): slow_short})
    flash_attn_func(q, k, v)
    route = last_dispatch()
    assert route is not None
    assert [r.code for r in route.reasons] == ["slower-than-sdpa"]
    q, k, v = _qkv(seqlen_k=600)  # the <=2048 bucket, where fa measured faster
    flash_attn_func(q, k, v)
    assert last_dispatch().path == "sass"  # type: ignore[union-attr]
    monkeypatch.setenv("FA_ROUTE", "fa")
    interface._decisions.clear()  # FA_ROUTE, like FA_SELF_CHECK, is read when a kind of call is decided
    flash_attn_func(*_qkv(seqlen_k=40))
    assert last_dispatch().path == "sass"  # type: ignore[union-attr]


def test_strict_mode_trusts_only_a_full_check(kernels, monkeypatch) -> None:
    monkeypatch.setenv("FA_SELF_CHECK", "strict")
    q, k, v = _qkv()
    flash_attn_func(q, k, v)
    assert [r.code for r in last_dispatch().reasons] == ["not-self-checked"]  # type: ignore[union-attr]
    assert emulated.LAUNCHED == []
    passed = {
        check_record.image_sha256(_image(kernels, direction)): check_record.UnitResult.now(
            unit=f"{direction}_fp16_d{DIM}",
            image="sass",
            passed=True,
            max_error=0.3,
            detail="",
            by=selfcheck.FULL_CHECK,
        )
        for direction in ("fwd", "splitkv")  # the images a forward call may take
    }
    check_record.write(selfcheck.machine_of(q.device), passed)
    interface._decisions.clear()
    selfcheck.forget()
    flash_attn_func(q, k, v)
    route = last_dispatch()
    assert route is not None
    assert route.path == "sass"
    assert route.verified == selfcheck.FULL_CHECK


@pytest.mark.usefixtures("kernels")
def test_off_uses_images_unchecked_and_says_so(monkeypatch) -> None:
    monkeypatch.setenv("FA_SELF_CHECK", "off")
    q, k, v = _qkv()
    route = interface.explain(q, k, v)
    assert route.path == "sass"
    assert route.verified == "off"
    assert emulated.LAUNCHED == []


@pytest.mark.usefixtures("kernels")
def test_under_torch_compile_an_unverified_image_is_not_used() -> None:
    q, k, v = _qkv()
    compiled = torch.compile(flash_attn_func, fullgraph=True, backend="eager")
    out = compiled(q, k, v)
    assert emulated.LAUNCHED == []  # neither a check nor the kernel ran inside the graph
    call = interface.inputs.check_padded(q, k, v, 0.0, None, False, (-1, -1), 0.0, None, False)
    expected, _ = fallback.attention(call, q, k, v, False)
    assert torch.equal(out, expected)
    assert interface._decisions == {}  # the pending answer is not kept: the next eager call checks
    flash_attn_func(q, k, v)
    route = last_dispatch()
    assert route is not None
    assert route.verified == selfcheck.FIRST_USE
    assert isinstance(route, decision.Dispatch)
