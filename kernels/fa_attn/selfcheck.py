"""fa never uses a kernel that failed where it runs: the first-use self-check, records, and speed routing.

`admit(call, route, q)` runs after the path decision for every call the kernels would serve. For each
unit the call would use (the forward, or the split-KV forward, and the backward when gradients are
needed), on the call's device:
- a verification record of `fa check` for this wheel, GPU, driver and torch (verify/record.py) that
  names the unit decides: pass, or fail -> SDPA with `self-check-failed`;
- else, the first time in the process, the unit runs once on a tiny problem against the fp32 reference
  (verify/unitcheck.py); a failure is remembered for the process (one warning per unit) and the call,
  and every later one the unit would serve, runs on SDPA with `self-check-failed`;
- where no check can run (CUDA graph capture, torch.compile tracing) and nothing is known yet, the call
  runs unchecked and says so (Dispatch.verified == "unchecked", in last_dispatch() and explain());
  FA_SELF_CHECK=strict falls back there instead (`not-verified`).
Then, with a record holding speed ratios, a unit measured slower than SDPA at the call's key length
sends the call to SDPA (`slower-than-sdpa`) unless FA_ROUTE=fa.

FA_SELF_CHECK: first-use (default), strict, off (no check, no record read). docs/checking.md says the rest.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from . import loader
from ._constant import assume_constant_result as _assume_constant_result
from ._env import reader
from .decision import Dispatch, KernelLaunch
from .dispatch import driver_version
from .reasons import Reason
from .verify import record as records
from .verify.unitcheck import Outcome, Problem, check_backward, check_forward, key_block

Units = tuple[tuple[str, str, str, tuple[int, ...]], ...]  # (direction, module, entries, launch)
MODES = ("first-use", "strict", "off")
ROUTES = ("auto", "fa")
# The tiny problem: the unit's key block and 15 keys of the next (so the online softmax rescales
# between blocks, and the split-KV forward really splits in two), two heads, as many queries as keys.
TINY_EXTRA_KEYS = 15


class FaSelfCheckWarning(UserWarning):
    """A unit of fa's kernels failed its check on this GPU: its calls run on torch SDPA."""


_FA_SELF_CHECK, _FA_ROUTE = reader("FA_SELF_CHECK"), reader("FA_ROUTE")


def mode() -> str:
    value = _FA_SELF_CHECK().strip() or "first-use"
    if value not in MODES:
        raise ValueError(f"FA_SELF_CHECK={value!r}: use one of {', '.join(MODES)} (default first-use)")
    return value


def route_mode() -> str:
    value = _FA_ROUTE().strip() or "auto"
    if value not in ROUTES:
        raise ValueError(f"FA_ROUTE={value!r}: use auto (default: SDPA where fa measured slower) or fa")
    return value


def record_key(device: torch.device) -> records.RecordKey:
    """This wheel on this GPU, as records are keyed."""
    props = torch.cuda.get_device_properties(device)
    return records.RecordKey(
        wheel=records.wheel_identity(loader.MANIFEST_FILE),
        gpu=props.name,
        sm=f"{props.major}.{props.minor}",
        driver=driver_version() or "",
        torch=torch.__version__,
    )


def capturing(device: torch.device) -> bool:
    """True inside CUDA graph capture on the device's current stream (no kernel may be checked there)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


# Facts of this process: per (device, unit, direction), None when the unit passed, else why it failed.
_lock = threading.Lock()
_verdicts: dict[tuple[str, str, str], Reason | None] = {}
_records: dict[str, records.Record | None] = {}
_warned: set[str] = set()
# Verified routes, so a call after the first pays a lookup: (id(route), device, dtype, causal, backward,
# splitkv, mode) -> (route, its admitted Dispatch, its units, _slower's reasons by seqlen_k before FA_ROUTE).
_admitted: dict[tuple[Any, ...], tuple[Dispatch, Dispatch, Units, dict[int, Reason | None]]] = {}
_unchecked: dict[int, tuple[Dispatch, Dispatch]] = {}  # FA_SELF_CHECK=off: id(route) -> (route, unchecked)
# _slower's answers, so a decode step does not look the record up again: (id(units), device, seqlen_k)
# -> (units, the reason or None); the record of a device is read once per process (until reset).
_slower_kept: dict[tuple[int, torch.device, int], tuple[Units, Reason | None]] = {}
# What the checks run on (tests swap in their own device identity); kept as module attributes.
key_of: Callable[[torch.device], records.RecordKey] = record_key
in_capture: Callable[[torch.device], bool] = capturing


def reset() -> None:
    """Forgets every verdict and record of this process (tests; a new record from `fa check`)."""
    with _lock:
        _verdicts.clear()
        _records.clear()
        _admitted.clear()
        _slower_kept.clear()
        _warned.clear()


def _record(device: torch.device) -> records.Record | None:
    name = str(device)
    with _lock:
        if name in _records:
            return _records[name]
    found = records.read(key_of(device))
    with _lock:
        _records[name] = found
    return found


def _units(route: Dispatch, backward: bool, splitkv: bool) -> list[tuple[str, KernelLaunch]]:
    """(direction, launch) of every unit the call would use."""
    units = []
    if splitkv and route.splitkv is not None:
        units.append(("splitkv", route.splitkv))
    if route.fwd is not None:
        units.append(("fwd", route.fwd))
    if backward and route.bwd is not None:
        units.append(("bwd", route.bwd))
    return units


def _failed(unit: str, gpu: str, error: str, max_err: float, bound: float, source: str) -> Reason:
    return Reason(
        "self-check-failed",
        f"unit {unit} failed {source} on {gpu}: {error} (max error {max_err:.3g}, bound {bound:.3g})",
        "run `fa check` for every unit; share `fa check --json` in an issue (docs/checking.md)",
    )


def _run_check(
    direction: str, launch: KernelLaunch, dtype: torch.dtype, causal: bool, device: torch.device
) -> Outcome:
    assert launch.launch, "a unit to check has launch data"
    n = key_block(launch) + TINY_EXTRA_KEYS
    problem = Problem(dtype, launch.launch[0], causal, n, n)
    if direction == "bwd":
        return check_backward(launch, problem, device)
    return check_forward(launch, problem, device, splitkv=direction == "splitkv")


def _verdict(
    direction: str,
    launch: KernelLaunch,
    dtype: torch.dtype,
    causal: bool,
    device: torch.device,
    can_run: bool,
) -> tuple[Reason | None, str]:
    """(why the unit must not be used or None, how it was verified)."""
    unit = records.unit_name(launch.module)
    memo = (str(device), unit, direction)
    with _lock:
        if memo in _verdicts:
            return _verdicts[memo], "self-check"
    found = _record(device)
    result = found.units.get(unit) if found is not None else None
    if result is not None:
        if result.passed:
            return None, "record"
        assert found is not None  # result came from it
        source = f"`fa check` ({found.written})"
        return _failed(unit, found.key.gpu, result.error, result.max_err, result.bound, source), "record"
    if not can_run:
        return None, "unchecked"
    why: Reason | None
    try:
        outcome = _run_check(direction, launch, dtype, causal, device)
        worst = outcome.worst
        why = (
            None
            if outcome.passed
            else _failed(unit, str(device), outcome.message(), worst.err, worst.bound, "its first-use check")
        )
    except Exception as err:  # noqa: BLE001 (a launch that raises is a failed check, not a crashed call)
        why = _failed(
            unit, str(device), f"{type(err).__name__}: {err}"[:300], float("inf"), 0.0, "its first-use check"
        )
    with _lock:
        _verdicts[memo] = why
    return why, "self-check"


def _warn_once(reason: Reason) -> None:
    with _lock:
        if reason.message in _warned:
            return
        _warned.add(reason.message)
    warnings.warn(
        f"fa_attn will not use a kernel here [{reason.code}]: {reason.message}. Its calls run on torch SDPA. "
        f"Next: {reason.fix}",
        FaSelfCheckWarning,
        stacklevel=5,
    )


def admit(
    route: Dispatch,
    device: torch.device,
    dtype: torch.dtype,
    causal: bool,
    seqlen_k: object,
    backward: bool,
    splitkv: bool = False,
    may_check: bool = True,
    compiling: bool | None = None,
) -> Dispatch:
    """`route` with how its units were verified, or the fallback when a unit failed, cannot be verified
    under strict, or was measured slower than SDPA near seqlen_k. may_check False (explain()): answer
    from what is known, never run a kernel. compiling: torch.compiler.is_compiling() when the caller
    asked already (None: asked here; a decode step asks once)."""
    if route.path == "fallback":
        return route
    chosen = mode()
    if chosen == "off":
        unchecked = _unchecked.get(id(route))
        if unchecked is None or unchecked[0] is not route:
            unchecked = _unchecked[id(route)] = (route, replace(route, verified="off"))
        return unchecked[1]
    if compiling is None:
        compiling = torch.compiler.is_compiling()
    memo = (id(route), device, dtype, causal, backward, splitkv, chosen)
    known = None if compiling else _admitted.get(memo)
    if known is not None and known[0] is route:  # settled for this route: only the speed can differ
        admitted, units, lengths = known[1], known[2], known[3]
        if seqlen_k in lengths:  # (a decode step's length: a lookup, no memo key to build)
            slower = lengths[seqlen_k]
        else:
            slower = _slower(units, device, seqlen_k)
            if isinstance(seqlen_k, int) and len(lengths) < 1024:
                lengths[seqlen_k] = slower
        if slower is not None and route_mode() != "fa":
            return Dispatch("fallback", None, (slower,))
        return admitted
    else:
        units = tuple((d, u.module, u.entries, u.launch) for d, u in _units(route, backward, splitkv))
        if compiling:
            code, message, fix, how = _traced(device.type, device.index, str(dtype), causal, units, chosen)
        else:
            can_run = may_check and not in_capture(device)
            code, message, fix, how = _admission(device, dtype, causal, units, chosen, can_run, may_check)
        if code:
            return Dispatch("fallback", None, (Reason(code, message, fix),))
        admitted = replace(route, verified=how)
        if how in ("record", "self-check") and not compiling:
            with _lock:
                _admitted[memo] = (route, admitted, units, {})
    if not compiling:
        slower = _slower(units, device, seqlen_k)
        if slower is not None and route_mode() != "fa":
            return Dispatch("fallback", None, (slower,))
    return admitted


def _admission(
    device: torch.device,
    dtype: torch.dtype,
    causal: bool,
    units: Units,
    chosen: str,
    can_run: bool,
    warn: bool,
) -> tuple[str, str, str, str]:
    """(reason code or "", message, fix, how verified): plain values, so torch.compile can bake them."""
    how: list[str] = []
    for direction, module, entries, launch in units:
        why, verified = _verdict(
            direction, KernelLaunch(module, entries, launch), dtype, causal, device, can_run
        )
        if why is not None:
            if warn:
                _warn_once(why)
            return why.code, why.message, why.fix, ""
        how.append(verified)
    if "unchecked" in how and chosen == "strict":
        unit = records.unit_name(units[0][1])
        return (
            "not-verified",
            (
                f"FA_SELF_CHECK=strict: unit {unit} has no passing check on {device} and none can run inside "
                "graph capture or torch.compile tracing"
            ),
            "run `fa check` once, or make one eager call before capturing or compiling",
            "",
        )
    return (
        "",
        "",
        "",
        ("unchecked" if "unchecked" in how else ("self-check" if "self-check" in how else "record")),
    )


# torch.compile runs this for real while tracing and bakes its result into the graph (as the path
# decision, interface._decide_for): records and this process's verdicts decide; no check can run.
@_assume_constant_result
def _traced(
    device_type: str, device_index: int | None, dtype: str, causal: bool, units: Units, chosen: str
) -> tuple[str, str, str, str]:
    device = torch.device(device_type) if device_index is None else torch.device(device_type, device_index)
    torch_dtype = torch.bfloat16 if dtype == str(torch.bfloat16) else torch.float16
    return _admission(device, torch_dtype, causal, units, chosen, can_run=False, warn=False)


def _slower(units: Units, device: torch.device, seqlen_k: object) -> Reason | None:
    """slower-than-sdpa when a record measured a unit of the call slower than SDPA at this length (the
    caller drops it under FA_ROUTE=fa, read only when there is such a reason: a decode step has none)."""
    if not isinstance(seqlen_k, int):  # symbolic under torch.compile: not routed
        return None
    memo = (id(units), device, seqlen_k)
    kept = _slower_kept.get(memo)
    if kept is not None and kept[0] is units:
        reason = kept[1]
    else:
        reason = _slower_in_record(units, device, seqlen_k)
        with _lock:
            if len(_slower_kept) >= 1024:
                _slower_kept.clear()
            _slower_kept[memo] = (units, reason)
    return reason


def _slower_in_record(units: Units, device: torch.device, seqlen_k: int) -> Reason | None:
    found = _record(device)
    if found is None:
        return None
    for direction, module, _entries, _launch in units:
        unit = records.unit_name(module)
        result = found.units.get(unit)
        ratio = (
            records.speed_ratio(result, "bwd" if direction == "bwd" else "fwd", seqlen_k) if result else None
        )
        if ratio is not None and ratio > 1.0:
            return Reason(
                "slower-than-sdpa",
                f"`fa check --bench` measured unit {unit} at {ratio:.2f}x SDPA's time on {found.key.gpu} "
                f"near {seqlen_k} keys",
                "nothing: SDPA is faster here; FA_ROUTE=fa forces fa's kernels",
            )
    return None
