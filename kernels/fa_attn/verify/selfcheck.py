"""fa never uses a kernel that failed where it runs: the first-use self-check, records, and speed routing.

`admit(route, call, ...)` runs after the path decision for every call the kernels would serve. For each
unit the call would use (the forward, the split-KV forward and its combine when the call has no
backward, and the backward when gradients are needed), on the call's device:
- a verification record of `fa check` for this wheel, GPU (its UUID), driver and torch
  (verify/record.py) that names the unit decides: pass (its numbers within its bound), or fail -> SDPA
  with `self-check-failed`;
- else the unit must have passed a check of the call's class (`CallClass`: causal, window, softcap,
  layout, page size, GQA group, MQA, head dim; per direction): the first call of a class runs the unit
  once on a small problem of that class against the fp32 reference (verify/unitcheck.py; autocast and
  TF32 off, on the call's device whatever torch.set_default_device says). A failure is remembered for
  the process (one warning per unit and class) and every call of that class runs on SDPA with
  `self-check-failed`; a failed split-KV unit only stops the split (the forward serves unsplit);
- a transient error during a check (out of memory, a CUDA graph capture begun elsewhere) disables
  nothing: the call runs on SDPA (`not-verified`) and a call of that class after RETRY_S checks again;
- where no check can run (CUDA graph capture, torch.compile tracing) and nothing is known yet, the call
  runs unchecked and says so (Dispatch.verified == "unchecked", in last_dispatch() and explain());
  FA_SELF_CHECK=strict falls back there instead (`not-verified`).
Then, with a record holding speed ratios, a unit measured slower than SDPA for the call's speed class
(direction, causal, decode) near its key length sends the call to SDPA (`slower-than-sdpa`) unless
FA_ROUTE=fa.

FA_SELF_CHECK: first-use (default), strict, off (no check, no record read). docs/checking.md says the rest.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, NamedTuple

import torch

from .._env import reader
from ..reasons import Reason
from ..runtime import call_cache, loader
from ..runtime.decision import Dispatch, KernelLaunch
from ..runtime.dispatch import driver_version
from ..runtime.inputs import AttnCall
from . import record as records
from .unitcheck import Outcome, Problem, check_backward, check_forward, key_block

Units = tuple[tuple[str, str, str, tuple[int, ...]], ...]  # (direction, module, entries, launch)
MODES = ("first-use", "strict", "off")
ROUTES = ("auto", "fa")
# The small problem: the unit's key block and 15 keys of the next (so the online softmax rescales
# between blocks, and the split-KV forward really splits in two), as many queries as keys (the split-KV
# unit: its query block and one more, so two query blocks meet two splits in its combine).
TINY_EXTRA_KEYS = 15
SCALE_FACTOR = 1.25  # the check's softmax_scale over the default: a kernel that ignores it fails
SOFTCAP = 2.0  # the check's softcap, near the scores' size so tanh bends them
RETRY_S = 1.0  # after a transient error, the next check of that unit and class waits this long
DECODE_QUERIES = 8  # at most this many queries per sequence: a decode step for speed routing


class CallClass(NamedTuple):
    """What about a call a unit's check must have covered for the unit to serve it (per direction)."""

    causal: bool
    window: str  # "none" | "left" | "right" | "both": which sides of the window bound the keys
    softcap: bool
    layout: str  # "padded" | "varlen" | "kvcache" (a KV-cache layout: seqused_k, leftpad, pages, ...)
    page_size: int  # 0: no block table
    group: int  # query heads per key head
    mqa: bool  # one key head for several query heads
    head_dim: int  # the call's (a unit of a larger head dim runs it zero-padded)


Facts = tuple[CallClass, tuple[bool, bool]]  # a call's class and speed class (speed_class)


def call_facts(call: AttnCall) -> Facts:
    """The call's class and speed class, one object per distinct value (so admit's memo keys it by id),
    kept per tensor-free call as interface keeps its route: a decode step pays one lookup."""
    kept = _classes.get(id(call))
    if kept is not None and kept[0] is call:
        return kept[1]
    found = (class_of(call), speed_class(call))
    with _lock:
        if len(_interned) >= 4096:  # (ids of dropped objects may come back: forget what keys by them)
            _interned.clear()
            _classes.clear()
            _admitted.clear()
        facts = _interned.setdefault(found, found)
        if call_cache.tensor_free(call):
            if len(_classes) >= 1024:
                _classes.clear()
            _classes[id(call)] = (call, facts)
    return facts


_classes: dict[int, tuple[AttnCall, Facts]] = {}  # (an entry keeps its call, so its id stays its own)
_interned: dict[Facts, Facts] = {}


def class_of(call: AttnCall) -> CallClass:
    """The call's class, computed (what torch.compile traces: no id() there)."""
    left, right = call.window_left >= 0, call.window_right >= 0 and not call.causal
    window = ("none", "right", "left", "both")[2 * left + right]
    kv = call.kv
    layout = "kvcache" if kv.features else ("varlen" if call.varlen is not None else "padded")
    heads, heads_k = call.heads, call.heads_k
    return CallClass(
        call.causal, window, call.softcap > 0, layout, kv.page_size if kv.block_table is not None or
        "paged_kv" in kv.features else 0, heads // heads_k, heads_k == 1 and heads > 1, call.head_dim,
    )  # fmt: skip


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
        uuid=driver_uuid(device),
        sm=f"{props.major}.{props.minor}",
        driver=driver_version() or "",
        torch=torch.__version__,
    )


def driver_uuid(device: torch.device) -> str:
    """The GPU's UUID as the CUDA driver reports it (torch's device properties carry it), "" when
    unknown: records are kept per physical GPU, so two GPUs of one model never share a verdict."""
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return records.normal_uuid(str(uuid)) if uuid is not None else ""


def capturing(device: torch.device) -> bool:
    """True inside CUDA graph capture on the device's current stream (no kernel may be checked there)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


# Facts of this process: per (device, unit, direction, class), None when the unit passed, else why it
# failed; and when a check met a transient error (it runs again RETRY_S later), with its reason.
_lock = threading.Lock()
_verdicts: dict[tuple[str, str, str, CallClass], Reason | None] = {}
_retry_at: dict[tuple[str, str, str, CallClass], tuple[float, Reason]] = {}
_records: dict[str, records.Record | None] = {}
_warned: set[str] = set()
# Verified routes, so a call after the first pays a lookup: (id(route), device, dtype, id(call_facts),
# backward, splitkv, mode) -> (route, its admitted Dispatch, its units, _slower's reasons by seqlen_k
# before FA_ROUTE).
_admitted: dict[tuple[Any, ...], tuple[Dispatch, Dispatch, Units, dict[int, Reason | None]]] = {}
_unchecked: dict[int, tuple[Dispatch, Dispatch]] = {}  # FA_SELF_CHECK=off: id(route) -> (route, unchecked)
# _slower's answers, so a decode step does not look the record up again: (id(units), device, speed
# class, seqlen_k) -> (units, the reason or None); the record of a device is read once per process.
_slower_kept: dict[tuple[int, torch.device, tuple[bool, bool], int], tuple[Units, Reason | None]] = {}
# What the checks run on (tests swap in their own device identity); kept as module attributes.
key_of: Callable[[torch.device], records.RecordKey] = record_key
in_capture: Callable[[torch.device], bool] = capturing


def reset() -> None:
    """Forgets every verdict and record of this process (tests; a new record from `fa check`)."""
    with _lock:
        _verdicts.clear()
        _retry_at.clear()
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


def problem_for(direction: str, launch: KernelLaunch, dtype: torch.dtype, cls: CallClass) -> Problem:
    """A small problem of the call's class for one unit: its key block and 15 keys (two key blocks,
    two splits), heads in the call's group (two key heads, so a wrong head mapping shows; one for MQA),
    the call's head dim as the runtime pads it (a multiple of 8), a softmax_scale that is not the default, and the call's
    mask, window, softcap and layout."""
    assert launch.launch, "a unit to check has launch data"
    n = key_block(launch) + TINY_EXTRA_KEYS
    seqlen_q = launch.launch[2] + 1 if direction == "splitkv" else n  # two query blocks
    left = n // 4 if cls.window in ("left", "both") else -1
    right = n // 5 if cls.window in ("right", "both") else -1
    heads_k = 1 if cls.mqa else 2
    head_dim = -(-cls.head_dim // 8) * 8  # what the runtime hands the unit: zero-padded to a multiple of 8
    return Problem(
        dtype, head_dim, cls.causal, seqlen_q, n, cls.group * heads_k, heads_k,
        layout="paged" if cls.page_size else cls.layout,
        window=(left, right), softcap=SOFTCAP if cls.softcap else 0.0,
        scale=SCALE_FACTOR / cls.head_dim**0.5, page_size=cls.page_size,
    )  # fmt: skip


@contextlib.contextmanager
def plain_math(device: torch.device) -> Iterator[None]:
    """What a check runs under, whatever the caller set: no autocast (the fp32 reference stays fp32),
    no TF32, new tensors on the check's device (torch.set_default_device aside)."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    tf32 = (matmul.allow_tf32, cudnn.allow_tf32)
    matmul.allow_tf32 = cudnn.allow_tf32 = False
    try:
        with contextlib.ExitStack() as stack:
            for kind in {"cpu", device.type}:
                stack.enter_context(torch.autocast(kind, enabled=False))
            stack.enter_context(torch.device(device))
            yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = tf32


def _run_check(
    direction: str, launch: KernelLaunch, dtype: torch.dtype, cls: CallClass, device: torch.device
) -> Outcome:
    problem = problem_for(direction, launch, dtype, cls)
    with plain_math(device):
        if direction == "bwd":
            return check_backward(launch, problem, device)
        return check_forward(launch, problem, device, splitkv=direction == "splitkv")


def transient(err: BaseException) -> bool:
    """An error that says nothing about the kernel: out of memory, or a graph capture begun meanwhile
    (the check then retries, docs/checking.md "Transient errors")."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(
        words in text for words in ("out of memory", "stream is capturing", "capture")
    )


def _deferred(unit: str, device: torch.device, err: BaseException) -> Reason:
    return Reason(
        "not-verified",
        f"unit {unit} could not be checked on {device} for this kind of call: {type(err).__name__}: "
        f"{str(err)[:200]} (not the kernel's fault; checked again after {RETRY_S:g} s)",
        "free GPU memory, or make one eager call outside graph capture; `fa check` records a verdict",
    )


def _verdict(
    direction: str,
    launch: KernelLaunch,
    dtype: torch.dtype,
    cls: CallClass,
    device: torch.device,
    can_run: bool,
) -> tuple[Reason | None, str]:
    """(why the unit must not be used or None, how it was verified)."""
    unit = records.unit_name(launch.module)
    memo = (str(device), unit, direction, cls)
    with _lock:
        if memo in _verdicts:
            return _verdicts[memo], "self-check"
        pending = _retry_at.get(memo)
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
    if pending is not None and time.monotonic() - pending[0] < RETRY_S:
        return pending[1], ""
    why: Reason | None
    try:
        outcome = _run_check(direction, launch, dtype, cls, device)
        worst = outcome.worst
        why = (
            None
            if outcome.passed
            else _failed(unit, str(device), outcome.message(), worst.err, worst.bound, "its first-use check")
        )
    except Exception as err:  # noqa: BLE001 (a launch that raises is a failed check, not a crashed call)
        if transient(err):
            deferred = _deferred(unit, device, err)
            with _lock:
                _retry_at[memo] = (time.monotonic(), deferred)
            return deferred, ""
        why = _failed(
            unit, str(device), f"{type(err).__name__}: {err}"[:300], float("inf"), 0.0, "its first-use check"
        )
    with _lock:
        _verdicts[memo] = why
        _retry_at.pop(memo, None)
    return why, "self-check"


def _warn_once(reason: Reason, instead: str = "torch SDPA") -> None:
    with _lock:
        if reason.message in _warned:
            return
        _warned.add(reason.message)
    warnings.warn(
        f"fa_attn will not use a kernel here [{reason.code}]: {reason.message}. Its calls run on {instead}. "
        f"Next: {reason.fix}",
        FaSelfCheckWarning,
        stacklevel=5,
    )


def speed_class(call: AttnCall) -> tuple[bool, bool]:
    """(causal, decode): with each unit's direction, the record's speed key (records.speed_key)."""
    return call.causal, call.seqlen_q <= DECODE_QUERIES


def admit(
    route: Dispatch,
    call: AttnCall,
    device: torch.device,
    dtype: torch.dtype,
    backward: bool,
    splitkv: bool = False,
    may_check: bool = True,
) -> Dispatch:
    """`route` with how its units were verified for the call's class, without its split-KV unit when
    that failed, or the fallback when a unit failed, cannot be verified under strict, or was measured
    slower than SDPA near the call's key length. may_check False (explain()): answer from what is
    known, never run a kernel. (Under torch.compile, interface._admitted_for asks `traced` instead.)"""
    if route.path == "fallback":
        return route
    chosen = mode()
    if route.then is not None:
        return _admit_arch_specific(route, call, device, dtype, backward, splitkv, may_check, chosen)
    if chosen == "off":
        unchecked = _unchecked.get(id(route))
        if unchecked is None or unchecked[0] is not route:
            unchecked = _unchecked[id(route)] = (route, replace(route, verified="off"))
        return unchecked[1]
    facts = call_facts(call)
    seqlen_k = call.seqlen_k
    memo = (id(route), device, dtype, id(facts), backward, splitkv, chosen)
    known = _admitted.get(memo)
    if known is not None and known[0] is route:  # settled for this route: only the speed can differ
        admitted, units, lengths = known[1], known[2], known[3]
        if seqlen_k in lengths:  # (a decode step's length: a lookup, no memo key to build)
            slower = lengths[seqlen_k]
        else:
            slower = _slower(units, device, facts[1], seqlen_k)
            if len(lengths) < 1024:
                lengths[seqlen_k] = slower
    else:
        units = tuple((d, u.module, u.entries, u.launch) for d, u in _units(route, backward, splitkv))
        can_run = may_check and not in_capture(device)
        code, message, fix, how, split_failed = _admission(
            device, dtype, facts[0], units, chosen, can_run, may_check, _instead.get(id(route), "torch SDPA")
        )
        admitted = _admitted_route(route, code, message, fix, how, split_failed)
        if admitted.path == "fallback":
            return admitted
        if split_failed:
            units = tuple(u for u in units if u[0] != "splitkv")
        if how in ("record", "self-check"):
            with _lock:
                _admitted[memo] = (route, admitted, units, {})
        slower = _slower(units, device, facts[1], seqlen_k)
    if slower is not None and route_mode() != "fa":
        return Dispatch("fallback", None, (slower,))
    return admitted


def _admit_arch_specific(
    route: Dispatch,
    call: AttnCall,
    device: torch.device,
    dtype: torch.dtype,
    backward: bool,
    splitkv: bool,
    may_check: bool,
    chosen: str,
) -> Dispatch:
    """An arch-specific route (sm_90a; decision.py): its units serve a call only once a check of the
    call's class passed on this GPU (a record, or the first-use check run now); otherwise the call takes
    the route's `then` (the plain arch's units, admitted as usual) with the reason in `passed_over`."""
    assert route.then is not None
    bare = _bare(route)
    why: Reason | None
    if chosen == "off":
        why = _specific_unchecked(route, "FA_SELF_CHECK=off runs no check")
    else:
        admitted = admit(bare, call, device, dtype, backward, splitkv, may_check)
        why = _specific_reason(route, admitted)
        if why is None:
            return admitted
    return _passed_on(admit(route.then, call, device, dtype, backward, splitkv, may_check), why)


def _passed_on(admitted: Dispatch, why: Reason) -> Dispatch:
    """admitted.passed_on(why), one object per (route, reason): a call that passes sm_90a over pays a
    lookup, not a new Dispatch."""
    key = (id(admitted), why.code, why.message)
    kept = _passed_kept.get(key)
    if kept is None or kept[0] is not admitted:
        if len(_passed_kept) >= 1024:
            _passed_kept.clear()
        kept = _passed_kept[key] = (admitted, admitted.passed_on(why))
    return kept[1]


_passed_kept: dict[tuple[int, str, str], tuple[Dispatch, Dispatch]] = {}
_bares: dict[int, tuple[Dispatch, Dispatch]] = {}  # id(route) -> (route, route without `then`)
_instead: dict[int, str] = {}  # id(bare route) -> what runs its calls when it fails (its warning says)


def _bare(route: Dispatch) -> Dispatch:
    """The arch-specific route without its `then`, one object per route (admit's memo keys it by id)."""
    kept = _bares.get(id(route))
    if kept is None or kept[0] is not route:
        if len(_bares) >= 1024:
            _bares.clear()
            _instead.clear()
        kept = _bares[id(route)] = (route, replace(route, then=None))
        then = route.then
        _instead[id(kept[1])] = (
            f"the sm {then.arch} units" if then is not None and then.arch else "torch SDPA"
        )
    return kept[1]


def _specific_reason(route: Dispatch, admitted: Dispatch) -> Reason | None:
    """Why the arch-specific route, admitted as `admitted`, must pass the call on (None: it serves)."""
    if admitted.path != "fallback":
        if admitted.verified in ("record", "self-check"):
            return None
        return _specific_unchecked(route, "no check can run inside graph capture or torch.compile tracing")
    first = admitted.reasons[0]
    if first.code == "self-check-failed":
        then = route.then
        instead = f"the sm {then.arch} units" if then is not None and then.arch else "torch SDPA"
        return Reason("arch-specific-check-failed", f"{first.message}; {instead} run the call", first.fix)
    if first.code == "not-verified":
        return _specific_unchecked(route, first.message)
    return Reason(
        "arch-specific-unsupported",
        f"the sm {route.arch} units do not serve this call here ({first.code}: {first.message})",
        f"nothing to do: the next kernels run it; {first.fix}",
    )


def _specific_unchecked(route: Dispatch, why: str) -> Reason:
    unit = records.unit_name(route.fwd.module) if route.fwd is not None else f"sm {route.arch}"
    return Reason(
        "arch-specific-unchecked",
        f"unit {unit} runs only after its check passes for this kind of call, and {why}",
        "make one eager call of this kind first, or run `fa check` (its record verifies the unit)",
    )


def _admitted_route(
    route: Dispatch, code: str, message: str, fix: str, how: str, split_failed: bool
) -> Dispatch:
    """The route _admission's answer gives: the fallback with its reason, or the route verified `how`
    (without its split-KV unit when that failed)."""
    if code:
        return Dispatch("fallback", None, (Reason(code, message, fix),))
    if split_failed:
        return replace(route, verified=how, splitkv=None)
    return replace(route, verified=how)


def _admission(
    device: torch.device,
    dtype: torch.dtype,
    cls: CallClass,
    units: Units,
    chosen: str,
    can_run: bool,
    warn: bool,
    instead: str = "torch SDPA",
) -> tuple[str, str, str, str, bool]:
    """(reason code or "", message, fix, how verified, the split-KV unit failed): plain values, so
    torch.compile can bake them. instead: what runs the calls of a unit that failed (its warning)."""
    how: list[str] = []
    split_failed = False
    for direction, module, entries, launch in units:
        why, verified = _verdict(
            direction, KernelLaunch(module, entries, launch), dtype, cls, device, can_run
        )
        if why is not None and direction == "splitkv" and why.code == "self-check-failed":
            split_failed = True  # the forward serves the call unsplit (its own verdict follows)
            if warn:
                _warn_once(why, instead)
            continue
        if why is not None:
            if warn and why.code == "self-check-failed":
                _warn_once(why, instead)
            return why.code, why.message, why.fix, "", False
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
            False,
        )
    verified = "unchecked" if "unchecked" in how else ("self-check" if "self-check" in how else "record")
    return "", "", "", verified, split_failed


def traced(
    route: Dispatch,
    device: torch.device,
    dtype: torch.dtype,
    cls: tuple[Any, ...],
    backward: bool,
    splitkv: bool,
    chosen: str,
) -> Dispatch:
    """admit() while torch.compile traces (interface._admitted_for runs it for real and bakes the
    answer into the graph): records and this process's verdicts decide; no check can run, no speed
    routing (the key length may be symbolic)."""
    if route.then is not None and route.path != "fallback":  # arch-specific: a record or a verdict only
        if chosen == "off":
            why: Reason | None = _specific_unchecked(route, "FA_SELF_CHECK=off runs no check")
        else:
            why = _specific_reason(route, traced(_bare(route), device, dtype, cls, backward, splitkv, chosen))
        if why is None:
            return traced(_bare(route), device, dtype, cls, backward, splitkv, chosen)
        return traced(route.then, device, dtype, cls, backward, splitkv, chosen).passed_on(why)
    if route.path == "fallback" or chosen == "off":
        return route if route.path == "fallback" else replace(route, verified="off")
    units = tuple((d, u.module, u.entries, u.launch) for d, u in _units(route, backward, splitkv))
    answer = _admission(device, dtype, CallClass(*cls), units, chosen, can_run=False, warn=False)
    return _admitted_route(route, *answer)


def _slower(units: Units, device: torch.device, speed: tuple[bool, bool], seqlen_k: int) -> Reason | None:
    """slower-than-sdpa when a record measured a unit of the call slower than SDPA for its speed class
    at this length (the caller drops it under FA_ROUTE=fa, read only when there is such a reason: a
    decode step has none)."""
    memo = (id(units), device, speed, seqlen_k)
    kept = _slower_kept.get(memo)
    if kept is not None and kept[0] is units:
        reason = kept[1]
    else:
        reason = _slower_in_record(units, device, speed, seqlen_k)
        with _lock:
            if len(_slower_kept) >= 1024:
                _slower_kept.clear()
            _slower_kept[memo] = (units, reason)
    return reason


def _slower_in_record(
    units: Units, device: torch.device, speed: tuple[bool, bool], seqlen_k: int
) -> Reason | None:
    found = _record(device)
    if found is None:
        return None
    for direction, module, _entries, _launch in units:
        unit = records.unit_name(module)
        result = found.units.get(unit)
        key = records.speed_key("bwd" if direction == "bwd" else "fwd", *speed)
        ratio = records.speed_ratio(result, key, seqlen_k) if result else None
        if ratio is not None and ratio > 1.0:
            return Reason(
                "slower-than-sdpa",
                f"`fa check --bench` measured unit {unit} at {ratio:.2f}x SDPA's time on {found.key.gpu} "
                f"near {seqlen_k} keys ({key})",
                "nothing: SDPA is faster here; FA_ROUTE=fa forces fa's kernels",
            )
    return None
