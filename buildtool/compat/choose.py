"""A choice: which wheel fits an environment best, and what the runtime will do with it.

Shared by `fa doctor` (explain) and `fa install` (act). Pure: an `Env`, the index entries and a `Request`
in, a `Selection` out.

Order of preference among the wheels that fit:
1. what GPU 0 would run: SASS, then PTX, then a kernel wheel whose calls fall back, then the universal
   wheel (no kernels). GPU 0 decides because it is torch's default device (cuda:0); further GPUs only
   break ties, and each one's answer is reported. Then the slimmest: a per-variant wheel over the
   all-wheel (variant "all", every torch and CUDA major in one wheel), which is the fallback for a
   machine no per-variant wheel serves as well.
2. the CUDA major of the installed torch (the driver supports it, or the wheel would not fit),
   else the highest major.
3. a wheel tested with the installed torch minor over a stable-ABI wheel that was not (it would
   still load: the stable ABI promises it; a per-minor wheel built for that very torch is the better fit).
4. the newest fa-attn version.
5. the stable-ABI wheel over a per-minor one that is equal in all of the above: it keeps working when
   torch is upgraded.
The verdict and the runtime answer are GPU 0's; `why` says in a sentence what decided between the
chosen wheel and the next best.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from buildtool.compat.env import Env, Gpu
from buildtool.compat.fit import (
    TagIndex,
    as_installed,
    binding_here,
    stack_reasons,
    supported_tags,
    untested_torch,
    wheel_reasons,
)
from buildtool.core import kernels_src
from buildtool.core.cpus import canonical
from buildtool.core.runtime import all_wheel, decision, reasons, schema

Reason = reasons.Reason
Dispatch = decision.Dispatch  # what a GPU would do with a wheel: the runtime's own answer

VERDICTS = ("ok", "ok-jit", "fallback", "no-wheel")
DTYPES = ("fp16", "bf16", "fp32")
_PATH_RANK = all_wheel.PATH_RANK  # SASS, then PTX, then the fallback


@dataclass(frozen=True)
class Request:
    """The call the user asks about (defaults: bf16, head dim 128, forward)."""

    dtype: str = "bf16"
    head_dim: int = 128
    backward: bool = False


@dataclass(frozen=True)
class WheelFit:
    entry: schema.IndexEntry
    reasons: tuple[Reason, ...]  # empty: fits

    @property
    def fits(self) -> bool:
        return not self.reasons


@dataclass(frozen=True)
class GpuAnswer:
    index: int
    gpu: Gpu
    runtime: Dispatch


@dataclass(frozen=True)
class Selection:
    verdict: str  # one of VERDICTS
    selected: schema.IndexEntry | None
    codes: tuple[str, ...]  # the reason codes that decide the verdict
    deciding: tuple[Reason, ...]  # one reason per code, with its message and fix
    wheels: tuple[WheelFit, ...]
    stack: tuple[Reason, ...]  # no-gpu / torch-not-cuda / torch-driver-too-old
    runtime: Dispatch  # GPU 0 with the selected wheel
    gpus: tuple[GpuAnswer, ...]  # every GPU with the selected wheel
    why: str = ""  # what decided between the selected wheel and the next best one ("" if none)
    warnings: tuple[Reason, ...] = ()  # about the selected wheel, not refusals (torch-newer-than-tested)


@dataclass
class Memo:
    """What select works out per wheel, kept for the next machine with the same inputs: for a caller that
    asks about many machines over the same entries (the index page, compat/picker.py, asks thousands).
    Each key holds everything its value is computed from, so a kept value is the one select would
    compute. Wheels are keyed by id(): a memo must not outlive the entries it was used with."""

    # (os, arch, glibc, python, torch, driver) -> every wheel's fit: a wheel's fit reads no GPU
    fits: dict[tuple[object, ...], tuple[WheelFit, ...]] = field(default_factory=dict)
    # (wheel, device, call[, binding, torch's CUDA major]) -> the runtime's decision
    decisions: dict[tuple[object, ...], Dispatch] = field(default_factory=dict)
    # (wheel, torch, os) -> the all-wheel's binding for that torch
    bindings: dict[tuple[object, ...], schema.BindingFile] = field(default_factory=dict)
    # (wheel, driver, torch, os) -> the wheel as installed there (fit.as_installed)
    views: dict[tuple[object, ...], schema.WheelInfo] = field(default_factory=dict)
    # (os, arch, glibc, python) -> the tags pip installs there
    tags: dict[tuple[object, ...], TagIndex] = field(default_factory=dict)
    # (GPU, driver) -> the device the decision reads
    devices: dict[tuple[object, ...], decision.Device] = field(default_factory=dict)


def device_of(gpu: Gpu | None, env: Env) -> decision.Device:
    """A described GPU as the decision reads it; its shared memory per block is the description's
    (`smem_per_block`, what a live call reads from the GPU itself), else the kernel table's figure for
    its arch (tiles.SMEM_LIMIT)."""
    if gpu is None:
        return decision.Device("cuda", None, None, env.driver)
    smem = (
        gpu.smem_per_block if gpu.smem_per_block is not None else kernels_src.tiles().SMEM_LIMIT.get(gpu.sm)
    )
    return decision.Device("cuda", gpu.sm, smem, env.driver)


def runtime_for(
    entry: schema.IndexEntry | None,
    env: Env,
    gpu: Gpu | None,
    request: Request,
    stack: Sequence[Reason],
    memo: Memo | None = None,
) -> Dispatch:
    """What a call does with `entry` installed: the runtime's decision, overruled by a broken stack."""
    if entry is None:
        return decision.fallback(*stack)
    call = decision.Call(request.dtype, request.head_dim, request.backward)
    if memo is None:
        device = device_of(gpu, env)
    else:
        device = memo.devices.get((gpu, env.driver)) or memo.devices.setdefault(
            (gpu, env.driver), device_of(gpu, env)
        )
    answer = _decide(entry.info, device, call, env, memo)
    # The decision says no-gpu itself when there is no GPU; the stack says it already.
    stack_codes = {r.code for r in stack}
    own = tuple(r for r in answer.reasons if r.code not in stack_codes)
    if stack:
        # torch cannot reach the GPU at all, so whatever image exists, calls fall back.
        return decision.fallback(*stack, *own)
    return dataclasses.replace(answer, reasons=own)


def _decide(
    info: schema.WheelInfo, device: decision.Device, call: decision.Call, env: Env, memo: Memo | None
) -> Dispatch:
    """The runtime's decision; for the all-wheel, its own choice of kernel set (all_wheel.decide_call)
    with the binding the running torch loads."""
    if not info.all_wheel:
        key: tuple[object, ...] = (id(info), device, call)
        if memo is None or key not in memo.decisions:
            answer = decision.decide(info, device, call)
            if memo is None:
                return answer
            memo.decisions[key] = answer
        return memo.decisions[key]
    torch_cuda = env.torch.cuda_major if env.torch else None
    if memo is None:
        return all_wheel.decide_call(info, binding_here(info, env), device, call, torch_cuda)[0]
    where = (id(info), env.torch, env.os)
    if where not in memo.bindings:
        memo.bindings[where] = binding_here(info, env)
    key = (id(info), device, call, memo.bindings[where], torch_cuda)
    if key not in memo.decisions:
        memo.decisions[key] = all_wheel.decide_call(info, memo.bindings[where], device, call, torch_cuda)[0]
    return memo.decisions[key]


def fits(entries: Sequence[schema.IndexEntry], env: Env, memo: Memo | None = None) -> tuple[WheelFit, ...]:
    """Every wheel with its reasons (none: it fits)."""
    key = (id(entries), env.os, env.arch, env.glibc, env.python, env.torch, env.driver)
    if memo is not None and key in memo.fits:
        return memo.fits[key]
    where = (env.os, env.arch, env.glibc, env.python)
    tags = memo.tags.get(where) if memo is not None else None
    if tags is None:
        tags = TagIndex.of(supported_tags(env))  # once for every wheel of the index
    if memo is not None:
        memo.tags[where] = tags
    wheels = tuple(WheelFit(e, tuple(wheel_reasons(e, env, tags))) for e in entries)
    if memo is not None:
        memo.fits[key] = wheels
    return wheels


def select(
    entries: Sequence[schema.IndexEntry], env: Env, request: Request = Request(), memo: Memo | None = None
) -> Selection:
    """The choice for `env`; `memo` keeps per-wheel work for the next call over the same entries."""
    if request.dtype not in DTYPES:
        raise ValueError(f"dtype: {request.dtype!r}; use one of {', '.join(DTYPES)}")
    if request.head_dim <= 0:
        raise ValueError(f"head dim: {request.head_dim}; use a positive number like 128")
    stack = tuple(stack_reasons(env))
    wheels = fits(entries, env, memo)
    gpus: list[Gpu | None] = list(env.gpus) or [None]

    def rank(fit: WheelFit) -> tuple[Any, ...]:
        paths = [runtime_for(fit.entry, env, gpu, request, stack, memo).path for gpu in gpus]
        kind = 3 if fit.entry.info.universal else _PATH_RANK[paths[0]]
        view = _as_installed(fit.entry, env, memo)
        untested = untested_torch(fit.entry, env, view) is not None
        # The slimmest wheel that serves as well: a per-variant wheel before the all-wheel.
        heavier = fit.entry.info.all_wheel
        others = [_PATH_RANK[p] for p in paths[1:]]
        return (kind, others, heavier, _cuda_preference(view, env), untested)

    # Equal ranks go to the newest fa-attn version (sort is stable), then the stable-ABI form, then
    # the file name.
    fitting = sorted((w for w in wheels if w.fits), key=lambda w: w.entry.file)
    fitting.sort(key=lambda w: not _stable(w.entry))
    fitting.sort(key=lambda w: _release(w.entry), reverse=True)
    fitting.sort(key=rank)
    selected = fitting[0].entry if fitting else None
    why = (
        _why(fitting[0].entry, fitting[1].entry, rank(fitting[0]), rank(fitting[1]), env)
        if len(fitting) > 1
        else ""
    )
    warning = (
        untested_torch(selected, env, _as_installed(selected, env, memo)) if selected is not None else None
    )
    answers = tuple(
        GpuAnswer(i, gpu, runtime_for(selected, env, gpu, request, stack, memo))
        for i, gpu in enumerate(env.gpus)
    )
    runtime = answers[0].runtime if answers else runtime_for(selected, env, None, request, stack, memo)

    if selected is None:
        verdict = "no-wheel"
    else:
        verdict = {"sass": "ok", "ptx": "ok-jit"}.get(runtime.path, "fallback")
    deciding = _deciding_reasons(verdict, selected, runtime, wheels, env, request, stack, memo)
    return Selection(
        verdict=verdict,
        selected=selected,
        codes=tuple(r.code for r in deciding),
        deciding=deciding,
        wheels=wheels,
        stack=stack,
        runtime=runtime,
        gpus=answers,
        why=why,
        warnings=(warning,) if warning else (),
    )


def _release(entry: schema.IndexEntry) -> Version:
    """The fa-attn release, without the variant: "0.1.0+cu12torch2.7" and "0.1.0+cu12torch2.10plus" are
    the same release (PEP 440 would order their local labels, which say nothing about newness)."""
    return Version(Version(entry.info.version).public)


def _stable(entry: schema.IndexEntry) -> bool:
    return bool(entry.info.binding_form == decision.STABLE)


def _why(
    chosen: schema.IndexEntry,
    other: schema.IndexEntry,
    chosen_rank: tuple[Any, ...],
    other_rank: tuple[Any, ...],
    env: Env,
) -> str:
    """One sentence: the first preference (module docstring) on which `chosen` beat `other`."""
    over = f"{chosen.file} over {other.file}: "
    kind, gpus, heavier, cuda, untested = (a != b for a, b in zip(chosen_rank, other_rank, strict=True))
    if kind:
        return over + "what GPU 0 runs with it (SASS, then PTX, then the fallback; the universal wheel last)"
    if gpus:
        return over + "what the other GPUs run with it"
    if heavier:
        return over + "it serves as well and is slimmer (one torch and CUDA major, not all of them)"
    if cuda:
        torch_major = env.torch.cuda_major if env.torch else None
        if chosen.info.cuda_major == torch_major:
            return over + f"its CUDA major ({chosen.info.cuda_major}) is the installed torch's"
        return over + f"the higher CUDA major ({chosen.info.cuda_major})"
    if untested:
        tested = (other.info.torch_tested or ("?",))[-1]
        running = env.torch.version if env.torch else "?"
        return (
            over
            + f"it was tested with torch {running}'s minor; {other.info.variant} only up to torch {tested}"
        )
    if _release(chosen) != _release(other):
        return over + f"the newer fa-attn ({_release(chosen)})"
    if _stable(chosen) != _stable(other):
        return over + (
            f"the same kernels; its stable-ABI binding (torch {chosen.info.torch} and newer) keeps working "
            f"when torch is upgraded, {other.info.variant}'s serves torch {other.info.torch} only"
        )
    return over + "equal in every preference; the first by file name"


def _as_installed(entry: schema.IndexEntry, env: Env, memo: Memo | None) -> schema.WheelInfo:
    if memo is None:
        return as_installed(entry.info, env)
    key = (id(entry.info), env.driver, env.torch, env.os)
    if key not in memo.views:
        memo.views[key] = as_installed(entry.info, env)
    return memo.views[key]


def _cuda_preference(view: schema.WheelInfo, env: Env) -> tuple[int, int]:
    """The installed torch's CUDA major first, then the highest; `view`: the wheel as installed here."""
    torch_major = env.torch.cuda_major if env.torch else None
    major = view.cuda_major or 0
    return (0 if major == torch_major else 1, -major)


def _deciding_reasons(
    verdict: str,
    selected: schema.IndexEntry | None,
    runtime: Dispatch,
    wheels: Sequence[WheelFit],
    env: Env,
    request: Request,
    stack: Sequence[Reason],
    memo: Memo | None,
) -> tuple[Reason, ...]:
    """The reasons behind the verdict, one per code: none for ok/ok-jit; the runtime's reasons when a
    kernel wheel was chosen but falls back; otherwise (universal wheel or nothing) the stack, the reasons
    of the nearest misses (the wheels for the installed torch, if any, with the fewest reasons), and
    what GPU 0 would do even with such a wheel."""
    if verdict in ("ok", "ok-jit"):
        return ()
    found: list[Reason] = []
    if selected is not None and not selected.info.universal:
        found += runtime.reasons
    else:
        found += stack
        misses = [w for w in wheels if not w.fits and (verdict == "no-wheel" or not w.entry.info.universal)]
        # The CPU and the torch installed are the user's given; the wheels built for them are the
        # nearest misses (an aarch64 wheel says nothing useful to an x86_64 machine).
        for_this_cpu = [w for w in misses if w.entry.info.platform == canonical(env.arch)]
        misses = for_this_cpu or misses
        other_torch = {"torch-version-mismatch", "torch-below-floor"}
        for_this_torch = [w for w in misses if not other_torch & {r.code for r in w.reasons}]
        misses = for_this_torch or misses
        if misses:
            fewest = min(len(w.reasons) for w in misses)
            nearest = sorted(
                (w for w in misses if len(w.reasons) == fewest),
                key=lambda w: (_cuda_preference(_as_installed(w.entry, env, memo), env), w.entry.file),
            )
            found += [r for w in nearest for r in w.reasons]
            kernel_wheels = [w.entry for w in nearest if not w.entry.info.universal]
            gpu = env.gpus[0] if env.gpus else None
            if kernel_wheels and gpu is not None:
                # With the wheel's own problems fixed, would the GPU run it? (a P100 still would not)
                would = runtime_for(kernel_wheels[0], env, gpu, request, (), memo)
                if would.path == "fallback":
                    found += would.reasons
    first: dict[str, Reason] = {}
    for reason in found:
        first.setdefault(reason.code, reason)
    return tuple(sorted(first.values(), key=lambda r: reasons.code_order(r.code)))
