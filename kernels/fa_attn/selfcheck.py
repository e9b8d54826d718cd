"""fa never uses a kernel image that failed on the GPU it runs on.

The kernels were checked on a CPU emulator of their PTX, never on a GPU by this project: the first GPU
they meet is a user's. So before an image serves its first call in a process on a device, `gate` makes
sure it is verified there:

- a record of this machine (check_record.py: GPU, compute capability, driver, torch) that `fa check` or
  an earlier process wrote for the image's exact bytes answers at once, pass or fail;
- otherwise (FA_SELF_CHECK=first-use, the default) the image runs once on a tiny problem, forward and,
  when the call needs gradients, backward, compared with the fp32 reference under flash-attn's error
  rule (reference.py); the result is kept for the process and written to the record.

An image that failed is never used again by this process (nor, through the record, by later ones): its
calls fall back to torch SDPA with the reason `self-check-failed`, naming the image, the output and the
bound, and one warning per image says how to look closer (`fa check`) and report it.

The check runs kernels and reads their results on the host, which neither CUDA graph capture nor
torch.compile's tracing allows. There, an image that no record and no earlier eager call in this
process has verified is not used: the call falls back with `not-self-checked` (the safe choice; one
eager call before capturing, or `fa check` once, verifies it). FA_SELF_CHECK=off uses images
unchecked, and says so in last_dispatch() (`verified="off"`); FA_SELF_CHECK=strict uses only images
that a full `fa check` passed on this machine.

Speed: with a record that holds `fa check --bench` ratios, a call whose length bucket measured fa
slower than SDPA on this GPU goes to SDPA (`slower-than-sdpa`); FA_ROUTE=fa keeps fa's kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import warnings
from collections.abc import Callable

import torch

from . import check_record, dispatch
from .check_record import Machine, UnitResult
from .decision import Dispatch, KernelLaunch, fallback
from .reasons import Reason

MODES = ("off", "first-use", "strict")
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}  # the kernels' dtypes
FULL_CHECK = "fa check"  # a result from the full check (strict mode trusts only these)
FIRST_USE = "first-use self-check"


class FaSelfCheckWarning(UserWarning):
    """A kernel image failed fa's self-check on this GPU; its calls run on torch SDPA."""


def mode() -> str:
    """FA_SELF_CHECK: off, first-use (default) or strict; another value is read as the default, with a
    warning (a typo must not switch the check off)."""
    value = os.environ.get("FA_SELF_CHECK", "first-use").strip().lower() or "first-use"
    if value not in MODES:
        warnings.warn(
            f"FA_SELF_CHECK={value!r} is not one of {', '.join(MODES)}; using first-use",
            FaSelfCheckWarning,
            stacklevel=3,
        )
        return "first-use"
    return value


def route_forced() -> bool:
    """FA_ROUTE=fa: use fa's kernels even where a record measured them slower than SDPA."""
    return os.environ.get("FA_ROUTE", "").strip().lower() == "fa"


# ---- the check of one image --------------------------------------------------------------------------

# The tiny problems, (seqlen_q, seqlen_k, causal) with the keys over two key blocks of the image's tile
# (the online softmax's rescaling between blocks runs) and ragged ends (the masking runs): seqlen_q
# 33 and keys block_n + 15, full and causal (a diagonal that is not the main one); the split-KV
# forward's with one query (decode) and 33, so that its two splits each get keys.
TINY_QUERIES = {"fwd": (33, 33), "bwd": (33, 33), "splitkv": (1, 33)}


def tiny_problems(launch: KernelLaunch, direction: str) -> list[tuple[int, int, bool]]:
    block_n = launch.launch[3]  # [head_dim, then per entry: threads, block_m, block_n, ...] (ops.py)
    short, longer = TINY_QUERIES[direction]
    return [(short, block_n + 15, False), (longer, block_n + 15, True)]


HEADS, HEADS_K = 2, 1  # GQA: two query heads read one K/V head


@dataclasses.dataclass(frozen=True)
class Unit:
    """One kernel image a call would use: what it is and how the ops launch it."""

    direction: str  # "fwd" | "bwd" | "splitkv"
    launch: KernelLaunch

    @property
    def name(self) -> str:
        return os.path.splitext(os.path.basename(self.launch.module))[0]

    @property
    def image(self) -> str:
        return "ptx" if self.launch.module.endswith(".ptx") else "sass"


# A check: (route, device, dtype, head_dim, direction) -> the worst error/bound ratio and what was checked.
Runner = Callable[[Dispatch, torch.device, torch.dtype, int, str], tuple[float, str]]


def run_tiny(
    route: Dispatch, device: torch.device, dtype: torch.dtype, head_dim: int, direction: str
) -> tuple[float, str]:
    """Run the route's image of `direction` on the tiny problems (its forward too for "bwd"; two
    splits of the keys for "splitkv") and compare with the fp32 reference; returns the worst
    error/bound ratio (at most 1 passes) and a line naming the worst output."""
    from . import inputs, interface  # interface imports this module: import it when a check runs
    from .reference import attention_ref, fa2_error

    backward = direction == "bwd"
    splits = 2 if direction == "splitkv" else 1
    gen = torch.Generator(device="cpu").manual_seed(0)
    worst, where = 0.0, "no output compared"
    image = {"fwd": route.fwd, "bwd": route.bwd, "splitkv": route.splitkv}[direction]
    assert image is not None, f"the route has no {direction} image"
    for seqlen_q, seqlen_k, causal in tiny_problems(image, direction):
        q, k, v, dout = (
            torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
            for shape in (
                (1, seqlen_q, HEADS, head_dim),
                (1, seqlen_k, HEADS_K, head_dim),
                (1, seqlen_k, HEADS_K, head_dim),
                (1, seqlen_q, HEADS, head_dim),
            )
        )
        call = inputs.check_padded(q, k, v, 0.0, None, causal, (-1, -1), 0.0, None, False)
        lq, lk, lv = (t.clone().requires_grad_(backward) for t in (q, k, v))
        with torch.enable_grad():
            out, _ = interface.run_kernels(call, route, lq, lk, lv, num_splits=splits)
        ref = attention_ref(q, k, v, causal)[0]
        outputs = [("out", out, ref, attention_ref(q, k, v, causal, upcast=False)[0])]
        if backward:
            grads = torch.autograd.grad(out, (lq, lk, lv), dout)
            ref_q, ref_k, ref_v = (t.detach().float().requires_grad_() for t in (q, k, v))
            ref_grads = torch.autograd.grad(
                attention_ref(ref_q, ref_k, ref_v, causal)[0], (ref_q, ref_k, ref_v), dout.float()
            )
            low_q, low_k, low_v = (t.detach().requires_grad_() for t in (q, k, v))
            low_out = attention_ref(low_q, low_k, low_v, causal, upcast=False)[0]
            low_grads = torch.autograd.grad(low_out, (low_q, low_k, low_v), dout)
            for name, g, r, lo in zip(("dq", "dk", "dv"), grads, ref_grads, low_grads, strict=True):
                outputs.append((name, g, r, lo))
        for name, ours, ref_t, low_t in outputs:
            err = fa2_error(name, ours.detach(), ref_t.detach(), low_t.detach())
            if err.ratio >= worst:
                kind = "causal" if causal else "full"
                worst = err.ratio
                where = (
                    f"{name} ({kind} {seqlen_q}x{seqlen_k}): max error {err.err:.3g}, bound {err.bound:.3g}"
                )
    return worst, where


# ---- the process's state ------------------------------------------------------------------------------

_lock = threading.Lock()
_results: dict[tuple[str, str], UnitResult] = {}  # (device key, image sha256) -> result, this process
_sha: dict[str, str] = {}  # image path -> sha256
_warned: set[str] = set()
runner: Runner = run_tiny  # tests swap in a faulty runner to show a failure is caught


def _image_sha(module: str) -> str:
    if module not in _sha:
        _sha[module] = check_record.image_sha256(module)
    return _sha[module]


@functools.cache
def machine_of(device: torch.device) -> Machine:
    """The record key of a live device (the GPU, driver and torch do not change within a process)."""
    if device.type != "cuda":  # the emulator (tests, `fa check --emulate`): one CPU "GPU"
        return Machine(gpu=f"emulated ({device.type})", sm="emu", driver=None, torch=torch.__version__)
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    name = torch.cuda.get_device_name(index)
    return Machine(name, f"{major}.{minor}", dispatch.driver_version(), torch.__version__)


_records: dict[Machine, dict[str, UnitResult]] = {}


def record_of(machine: Machine) -> dict[str, UnitResult]:
    """The machine's record, read once per process (this process's own checks update it)."""
    with _lock:
        if machine not in _records:
            _records[machine] = check_record.read(machine)
        return _records[machine]


def cannot_run_now() -> str | None:
    """Why a kernel cannot be run and read back right now (None: it can)."""
    if torch.compiler.is_compiling():
        return "torch.compile is tracing the call"
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return "a CUDA graph is being captured"
    return None


def units_of(route: Dispatch, backward: bool) -> list[Unit]:
    units = [Unit("fwd", route.fwd)] if route.fwd else []
    if backward and route.bwd:
        units.append(Unit("bwd", route.bwd))
    if route.splitkv and not backward:
        units.append(Unit("splitkv", route.splitkv))
    return units


def gate(route: Dispatch, device: torch.device, dtype: str, backward: bool) -> tuple[Dispatch, bool]:
    """The route a call of `dtype` ("fp16" | "bf16": the kernels') may take on `device`, after the
    self-check; and whether that answer is final for the process (False while a check is pending under
    capture or tracing: ask again later)."""
    if route.path == "fallback":
        return route, True
    how = mode()
    if how == "off":
        return dataclasses.replace(route, verified="off"), True
    machine = machine_of(device)
    record = record_of(machine)
    seen: list[str] = []
    for unit in units_of(route, backward):
        sha = _image_sha(unit.launch.module)
        key = (str(device), sha)
        with _lock:
            result = _results.get(key)
        if result is None:
            result = record.get(sha)
        if result is not None and how == "strict" and result.by != FULL_CHECK and result.passed:
            result = None  # strict: only a full `fa check` vouches
        if result is None:
            if how == "strict":
                return _unverified(unit, "FA_SELF_CHECK=strict and no `fa check` passed it on this GPU"), True
            why = cannot_run_now()
            if why is not None:
                return _unverified(unit, why), False
            result = _check(route, unit, device, _DTYPES[dtype], machine, sha)
        if not result.passed:
            _warn(unit, result)
            return _failed(unit, result), True
        seen.append(result.by)
    verified = FULL_CHECK if seen and all(b == FULL_CHECK for b in seen) else FIRST_USE
    return dataclasses.replace(route, verified=verified), True


def _check(
    route: Dispatch,
    unit: Unit,
    device: torch.device,
    dtype: torch.dtype,
    machine: Machine,
    sha: str,
) -> UnitResult:
    head_dim = route.head_dim or unit.launch.launch[0]
    try:
        ratio, where = runner(route, device, dtype, head_dim, unit.direction)
        passed, detail = ratio <= 1.0, where
    except Exception as error:  # noqa: BLE001 (a crashing kernel is a failed check, named, not a crash)
        ratio, passed = float("inf"), False
        detail = f"{type(error).__name__}: {str(error)[:300]}"
    result = UnitResult.now(
        unit=unit.name, image=unit.image, passed=passed, max_error=ratio, detail=detail, by=FIRST_USE
    )
    with _lock:
        _results[(str(device), sha)] = result
        _records.setdefault(machine, {})[sha] = result
    try:
        check_record.write(machine, {sha: result})
    except OSError:
        pass  # an unwritable cache: the result still holds for this process
    return result


def _failed(unit: Unit, result: UnitResult) -> Dispatch:
    return fallback(
        Reason(
            "self-check-failed",
            f"kernel {unit.name} ({unit.image}) failed fa's self-check on this GPU ({result.by}, "
            f"{result.checked_at}): {result.detail}",
            "calls run on torch SDPA meanwhile; run `fa check` to see every kernel here, and report it "
            "with `fa check --json` attached",
        )
    )


def _unverified(unit: Unit, why: str) -> Dispatch:
    return fallback(
        Reason(
            "not-self-checked",
            f"kernel {unit.name} ({unit.image}) is not verified on this GPU yet, and {why}",
            "make one eager call before capturing or compiling (it runs the check), or run `fa check` "
            "once; FA_SELF_CHECK=off uses kernels unchecked",
        )
    )


def _warn(unit: Unit, result: UnitResult) -> None:
    with _lock:
        if unit.name in _warned:
            return
        _warned.add(unit.name)
    warnings.warn(
        f"fa_attn: kernel {unit.name} ({unit.image}) failed its self-check on this GPU: {result.detail}. "
        "Its calls run on torch SDPA. `fa check` (or `python -m fa_attn.check`) checks every kernel here; "
        "please report it with `fa check --json` attached.",
        FaSelfCheckWarning,
        stacklevel=5,
    )


def route_by_speed(route: Dispatch, device: torch.device, backward: bool, bucket: str) -> Dispatch:
    """SDPA instead of fa where `fa check --bench` measured fa slower on this GPU for the call's images
    and length bucket (check_record.bucket_of; FA_ROUTE=fa keeps fa)."""
    if route.path == "fallback" or route_forced():
        return route
    record = record_of(machine_of(device))
    if not any(r.speed for r in record.values()):
        return route  # no speed measured here: nothing to route by (the common case, kept cheap)
    for unit in units_of(route, backward):
        result = record.get(_image_sha(unit.launch.module))
        ratio = result.speed.get(f"{unit.direction} {bucket}") if result else None
        if ratio is not None and ratio > 1.0:
            return fallback(
                Reason(
                    "slower-than-sdpa",
                    f"`fa check --bench` measured kernel {unit.name} {ratio:.2f}x SDPA's time on this GPU "
                    f"for keys {bucket}",
                    "nothing to do: SDPA is the faster choice here; FA_ROUTE=fa uses fa's kernels anyway",
                )
            )
    return route


def forget() -> None:
    """Clear this process's results (tests)."""
    with _lock:
        _results.clear()
        _sha.clear()
        _warned.clear()
        _records.clear()
    machine_of.cache_clear()
