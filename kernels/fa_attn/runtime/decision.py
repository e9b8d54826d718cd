"""Which path a call takes, and why: fa's kernels from SASS or PTX, or the fallback to torch SDPA.

One pure function, `decide`, answers for the runtime (the live device, the installed manifest) and for
`fa doctor` (a GPU described in JSON, an index.json entry), so the two cannot disagree: they run this
code. Stdlib only: buildtool loads this same file (buildtool/core/runtime.py) without importing torch.

The rules (CUDA C++ Programming Guide, "Binary Compatibility"; CUDA Compatibility guide, "PTX"): SASS built for X.Y runs on X.Z for Z >= Y, never
across majors, so the best image is the SASS of the device's major with the highest minor <= the
device's. Failing that, PTX whose arch <= the device's can be JIT-compiled by the driver, but only by a
driver at least as new as the toolkit that wrote it (`ptx_min_driver`). Capability is always a range,
never an equality test, but for an arch-specific image (sm_90a, "9.0a"): its SASS runs on its own compute
capability exactly, and no PTX of one is shipped. An image runs a call when it covers the dtype, the padded
head dim, the backward if needed, and the GPU offers the shared memory its kernels ask for (an sm_80 cubin
of up to 163 KB runs on an sm_86 part only within its 99 KB).

On its GPU the arch-specific image comes first (9.0a before 9.0); a call it does not serve (its features,
the backward, split-KV) passes on to the next image, the reason kept in `Dispatch.passed_over`. A route
that chose it carries the next one (`Dispatch.then`): the runtime takes that one when the arch-specific
units have not passed their check for the call's class (selfcheck.admit), so they never run unchecked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..reasons import Reason
from ..schema import Coverage, KernelFile, WheelInfo
from ..versions import (
    KERNEL_ARCH_FLOOR,
    MIN_TORCH,
    driver_at_least,
    parse_arch,
    parse_target,
    sass_runs_on,
    target_name,
    torch_minor,
    torch_version,
    version_text,
)

MAX_HEAD_DIM = 256  # flash-attn 2.x's limit; no bucket of ours is larger
HEAD_DIM_ALIGN = 8  # the wrapper pads other head dims up to a multiple of 8
KERNEL_DTYPES = ("fp16", "bf16")

_DTYPE_ALIASES = {
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "fp64": "fp64",
    "float64": "fp64",
    "double": "fp64",
    "torch.float64": "fp64",
}
GRID_CODES = {"q_blocks": 0, "k_blocks": 1, "q_blocks_splits": 2}  # how the ops receive a Launch's grid
# The KV-cache layouts (kernels/csrc/params.h): the forward and split-KV kernels read them, no backward
# kernel does (flash-attn has no backward for them either), so a call that needs gradients falls back.
KV_LAYOUT_FEATURES = frozenset({"paged_kv", "seqused_k", "leftpad_k", "cache_batch_idx"})


@dataclass(frozen=True)
class Device:
    """What the call runs on."""

    kind: str  # the tensors' device: "cuda" (an NVIDIA GPU), "rocm" (torch's "cuda" on AMD), "cpu", ...
    sm: str | None  # compute capability, "8.6"; None: no NVIDIA GPU visible
    smem_per_block: int | None = None  # opt-in shared memory per block, bytes; None: unknown (not checked)
    driver: str | None = None  # "575.51.03"; None: unknown (PTX is assumed JIT-able; loading would say)


@dataclass(frozen=True)
class Call:
    """What the call asks for."""

    dtype: str  # "fp16" | "bf16" | "fp32" | "fp64" (aliases such as "torch.bfloat16" accepted)
    head_dim: int  # as the caller passes it (padded here)
    backward: bool = False  # autograd will need the backward
    features: frozenset[str] = frozenset()  # kernel features used (names of tiles.FEATURES)
    page_size: int = 0  # keys per page of a paged k/v ("paged_kv"); the kernels read a key block per page


@dataclass(frozen=True)
class KernelLaunch:
    """How the ops launch one kernel file: its path, its entry points in order, and their launch data:
    [head_dim_bucket, then per entry: threads, block_m, block_n, smem_bytes, grid code] (ops.py)."""

    module: str  # absolute path of the cubin/PTX file
    entries: str  # comma-separated extern "C" names, in launch order
    launch: tuple[int, ...]

    @classmethod
    def of(cls, kernel: KernelFile, package_dir: Path) -> KernelLaunch:
        launch = [kernel.head_dim]
        for spec in kernel.entries.values():
            launch += [spec.threads, spec.block_m, spec.block_n, spec.smem_bytes, GRID_CODES[spec.grid]]
        return cls(str(package_dir / kernel.file), ",".join(kernel.entries), tuple(launch))


@dataclass(frozen=True)
class Dispatch:
    """The decision: which path runs a call, and why the kernels don't when they don't."""

    path: str  # "sass" | "ptx" | "fallback"
    arch: str | None  # arch of the image that runs ("8.0"); None on fallback
    reasons: tuple[Reason, ...]  # why fallback (empty otherwise)
    head_dim: int | None = None  # head dim the kernels run with (padded to a multiple of 8)
    fwd: KernelLaunch | None = field(default=None, repr=False)  # what the ops launch (runtime only)
    bwd: KernelLaunch | None = field(default=None, repr=False)  # None: no backward will run
    # The split-KV forward (decode shapes), for calls without a backward; None where the wheel has none.
    splitkv: KernelLaunch | None = field(default=None, repr=False)
    # How the kernels' units were verified on this GPU (fa_attn.selfcheck): "record" (`fa check`),
    # "self-check" (first use in this process), "unchecked" (ran where no check can run: graph capture,
    # torch.compile tracing), "off" (FA_SELF_CHECK=off); "" when not asked (fallback, doctor).
    verified: str = ""
    # Why better images were not used (an arch-specific one that does not serve the call or has not
    # passed its check here); the path above says what runs instead.
    passed_over: tuple[Reason, ...] = ()
    # An arch-specific route's next route (the plain arch's, or the fallback): what runs until the
    # arch-specific units pass their check for the call's class. None on every other route.
    then: Dispatch | None = field(default=None, repr=False)

    def passed_on(self, reason: Reason) -> Dispatch:
        """This route, taken because a better (arch-specific) one was passed over for `reason`."""
        return replace(self, passed_over=(reason, *self.passed_over))

    # The tile each direction runs with, chosen by the GPU's shared memory: (("fwd", "m128n32w4s1"),
    # ...); empty on fallback or for wheels before schema 1.4. Not compared: the path is the decision.
    tiles: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    # What the kernels path leaves out and why, without falling back (split-KV that does not run here).
    notes: tuple[Reason, ...] = field(default=(), compare=False)


def normalize_dtype(dtype: str) -> str:
    """ "bf16"/"bfloat16"/"torch.bfloat16" -> "bf16". ValueError for anything that is not a float."""
    canon = _DTYPE_ALIASES.get(str(dtype).lower())
    if canon is None:
        raise ValueError(f"dtype: {dtype!r} is not a floating-point attention dtype; use fp16, bf16 or fp32")
    return canon


def padded_head_dim(head_dim: int) -> int:
    if head_dim <= 0:
        raise ValueError(f"head_dim: {head_dim} must be positive")
    return -(-head_dim // HEAD_DIM_ALIGN) * HEAD_DIM_ALIGN


def fallback(*reasons: Reason) -> Dispatch:
    return Dispatch("fallback", None, tuple(reasons))


def decide(
    wheel: WheelInfo,
    device: Device,
    call: Call,
    kernels: Sequence[KernelFile] | None = None,
    package_dir: Path = Path("."),
    load_binding: Callable[[], Reason | None] | None = None,
    arch_specific: bool = True,
) -> Dispatch:
    """The path a call takes with this wheel installed, or every reason it falls back.

    wheel: what the manifest (or the wheel's index.json entry) says. kernels: the manifest's kernel
    files, to fill the launches (the runtime); None to decide only (doctor). load_binding: called last,
    only when the kernels would run (the runtime loads the binding there); None: assumed loadable.
    arch_specific: False leaves the arch-specific images out (an arch-specific route's `then`).
    """
    if device.kind != "cuda":
        where = "ROCm (AMD GPU)" if device.kind == "rocm" else device.kind
        return fallback(
            Reason(
                "device-not-cuda",
                f"the tensors are on {where}; fa's kernels are NVIDIA-only",
                "move q, k, v to an NVIDIA GPU (.cuda()) to use fa's kernels",
            )
        )
    dtype = normalize_dtype(call.dtype)
    reasons = []
    if dtype == "fp64":
        reasons.append(_no_dtype_kernel(dtype))
    supported = frozenset(wheel.features)
    for feature in sorted(call.features - supported):
        reasons.append(
            Reason(
                "feature-unsupported",
                f"{feature} is not supported by fa's kernels (they support: "
                f"{', '.join(sorted(supported)) or 'none listed in the manifest'})",
                f"call without {feature} to use the kernels",
            )
        )
    inference_only = sorted(call.features & supported & KV_LAYOUT_FEATURES)
    if call.backward and inference_only:
        reasons.append(
            Reason(
                "backward-unsupported",
                f"{', '.join(inference_only)} (a KV-cache layout) has forward kernels only",
                "call without requires_grad (e.g. under torch.no_grad()) to use the kernels",
            )
        )
    found = _image(wheel, device, dtype, call, arch_specific)
    if isinstance(found, list):
        codes = {r.code for r in reasons}  # an fp64 call has its dtype-unsupported already
        reasons += [r for r in found if r.code not in codes]
    if reasons or isinstance(found, list):
        return fallback(*reasons)
    image, head_dim, passed, chosen = found
    then = None
    if image.specific:  # what runs when the arch-specific units are passed over (no binding loaded here)
        then = decide(wheel, device, call, kernels, package_dir, None, arch_specific=False)
    notes: list[Reason] = []
    if not call.backward:
        split_row = _split_row(wheel, image, device, dtype, head_dim, notes)
        if split_row is not None:
            chosen["splitkv"] = split_row
    fwd = bwd = split = None
    if kernels is not None:
        files = {d: _kernel_file(kernels, image, row, head_dim) for d, row in chosen.items()}
        fwd_file, bwd_file, split_file = files["fwd"], files.get("bwd"), files.get("splitkv")
        problem = None
        if fwd_file is None or (call.backward and bwd_file is None):
            problem = Reason(
                "binding-unavailable",
                f"the manifest covers {dtype} head dim {head_dim} on {image.target} "
                "but lists no kernel file for it",
                "reinstall fa-attn (damaged manifest)",
            )
        elif not _holds_key_blocks(fwd_file, call.page_size):
            problem = _pages_too_small(fwd_file, call.page_size, image.target)
        if problem is not None and then is not None:
            return _with_binding(then.passed_on(_specific_gap(image, problem)), load_binding)
        if problem is not None:
            return fallback(problem)
        assert fwd_file is not None
        fwd = KernelLaunch.of(fwd_file, package_dir)
        bwd = KernelLaunch.of(bwd_file, package_dir) if bwd_file else None
        if split_file is not None and not _holds_key_blocks(split_file, call.page_size):
            notes.append(_no_split(_pages_too_small(split_file, call.page_size, image.target).message))
            chosen.pop("splitkv")
        elif split_file is not None:
            split = KernelLaunch.of(split_file, package_dir)
        elif then is not None:  # the arch-specific units have no split-KV form: the plain arch's serves
            split = then.splitkv
    tiles = tuple((direction, row.tile) for direction, row in chosen.items() if row.tile)
    route = Dispatch(
        image.image, image.target, (), head_dim, fwd, bwd, split,
        passed_over=passed, then=then, tiles=tiles, notes=tuple(notes),
    )  # fmt: skip
    return _with_binding(route, load_binding)


def _with_binding(route: Dispatch, load_binding: Callable[[], Reason | None] | None) -> Dispatch:
    """`route`, or the fallback when the binding it would run with does not load (asked only then)."""
    if route.path == "fallback" or load_binding is None:
        return route
    problem = load_binding()
    return route if problem is None else fallback(problem)


# ---- the image that runs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Image:
    arch: str  # the compute capability it is built for
    image: str  # "sass" | "ptx"
    specific: bool = False  # built for the arch-specific target of `arch` ("9.0a"): runs there only

    @property
    def target(self) -> str:
        return target_name(self.arch, self.specific)


def _specific_gap(img: _Image, why: Reason) -> Reason:
    """Why an arch-specific image does not serve a call that the next image may serve."""
    return Reason(
        "arch-specific-unsupported",
        f"the sm {img.target} units do not serve this call ({why.code}: {why.message})",
        f"nothing to do: the next kernels run it; {why.fix}",
    )


def _no_dtype_kernel(dtype: str) -> Reason:
    return Reason(
        "dtype-unsupported",
        f"{dtype} attention has no kernel (fp16 and bf16 only)",
        "cast q, k, v to torch.bfloat16 or torch.float16",
    )


def _image(
    wheel: WheelInfo, device: Device, dtype: str, call: Call, arch_specific: bool = True
) -> tuple[_Image, int, tuple[Reason, ...], dict[str, Coverage]] | list[Reason]:
    """The best image that runs the whole call, the head dim it runs with, why the arch-specific images
    before it did not, and the program (coverage row) each direction runs; or why none does.
    arch_specific False: those images are left out."""
    if device.sm is None:
        no_gpu = "run on a machine with an NVIDIA GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
        return [Reason("no-gpu", "no NVIDIA GPU is visible", no_gpu)]
    sm = device.sm
    if wheel.universal:
        name = wheel.variant or wheel.version or "this wheel"
        fix = "install the fa-attn wheel built for your torch and CUDA major (`fa install`)"
        return [
            Reason("binding-unavailable", f"{name} has no kernels or host binding (universal wheel)", fix)
        ]
    if dtype not in KERNEL_DTYPES:
        return [_no_dtype_kernel(dtype)]
    if call.head_dim > MAX_HEAD_DIM:
        too_large = f"head dim {call.head_dim} is larger than {MAX_HEAD_DIM}"
        return [Reason("head-dim-unsupported", too_large, f"use a head dim <= {MAX_HEAD_DIM}")]
    padded = padded_head_dim(call.head_dim)

    gpu = parse_arch(sm)
    # Distinct (arch, image) pairs first, then one _Image each: a wheel has hundreds of coverage rows
    # and few images, and doctor and the index page decide thousands of times (bench/install/index_page.py).
    rows = (row for row in wheel.coverage if arch_specific or not row.arch_specific)
    images = [_Image(*key) for key in dict.fromkeys((row.arch, row.image, row.arch_specific) for row in rows)]
    runnable = sorted(
        (img for img in images if _runs_on(img, gpu)), key=lambda i: parse_target(i.target), reverse=True
    )
    sass = [img for img in runnable if img.image == "sass"]
    ptx = [img for img in runnable if img.image == "ptx"]
    reasons: list[Reason] = []
    floor = wheel.ptx_min_driver
    if ptx and device.driver is not None and floor and not driver_at_least(device.driver, floor):
        reasons.append(
            Reason(
                "ptx-driver-too-old",
                f"no SASS for sm {sm}; the PTX (compute {ptx[0].arch}) needs driver >= {floor}, "
                f"found {device.driver}",
                f"update the NVIDIA driver to >= {floor}, or install a wheel with SASS for sm {sm}",
            )
        )
        ptx = []
    if not sass and not ptx:
        if not reasons:
            archs = ", ".join(sorted({img.target for img in images}, key=parse_target)) or "none"
            # Below the kernels' floor no wheel helps: say what does work instead of a wheel fa
            # would refuse to build.
            fix = (
                f"nothing to install: fa's kernels need sm {KERNEL_ARCH_FLOOR} (Turing) or newer, so calls "
                "on this GPU run on torch SDPA, which supports it"
                if gpu < parse_arch(KERNEL_ARCH_FLOOR)
                else f"install a wheel built for sm {sm}, or a newer one with PTX <= {sm}"
            )
            reasons.append(
                Reason(
                    "arch-unsupported", f"no kernel image runs on sm {sm} (SASS/PTX built for: {archs})", fix
                )
            )
        return reasons

    # Walk the images best-first; the first one that runs the whole call wins. Otherwise report the
    # gap of the best image, which is the one a fix (a wheel with more coverage) would use.
    # An arch-specific image that does not serve the call passes it on, with its reason; when no image
    # serves it, the reason given is the best plain image's (a wheel with more coverage fixes that one).
    gaps = [_gap(wheel, img, device, dtype, call, padded) for img in sass + ptx]
    passed: list[Reason] = []
    for img, gap in zip(sass + ptx, gaps, strict=True):
        if not isinstance(gap, Reason):
            return img, padded, tuple(passed), gap
        if img.specific:
            passed.append(_specific_gap(img, gap))
    plain = [g for img, g in zip(sass + ptx, gaps, strict=True) if isinstance(g, Reason) and not img.specific]
    return [*reasons, plain[0] if plain else next(g for g in gaps if isinstance(g, Reason))]


def _runs_on(img: _Image, gpu: tuple[int, int]) -> bool:
    """SASS within the GPU's major up to its minor; PTX of any arch up to the GPU's; an arch-specific
    image (fa ships no PTX of one, but a file may say so) on its own arch only."""
    if img.image == "sass" or img.specific:
        return sass_runs_on(img.target, f"{gpu[0]}.{gpu[1]}")
    return parse_arch(img.arch) <= gpu


def _rows(wheel: WheelInfo, img: _Image, dtype: str, direction: str) -> list[Coverage]:
    key = (img.arch, img.image, img.specific, dtype, direction)
    return [
        row
        for row in wheel.coverage
        if (row.arch, row.image, row.arch_specific, row.dtype, row.direction) == key
    ]


# bf16 mma starts with Ampere: Turing (sm 7.5) has none, so tiles.py's sm75 family builds fp16 only and
# no wheel can carry bf16 kernels for it.
BF16_ARCH_FLOOR = (8, 0)


def _dtype_fix(dtype: str, device: Device) -> str:
    """The other dtype, and a wheel with this one only where such a wheel can exist (doctor's fixes never
    name a wheel that cannot)."""
    if dtype == "bf16" and device.sm is not None and parse_arch(device.sm) < BF16_ARCH_FLOOR:
        return f"use fp16: sm {device.sm} has no bf16 tensor cores, so no wheel has bf16 kernels for it"
    other = "bf16" if dtype == "fp16" else "fp16"
    return f"use {other}, or a wheel with {dtype} kernels for sm {device.sm}"


def _gap(
    wheel: WheelInfo, img: _Image, device: Device, dtype: str, call: Call, padded: int
) -> Reason | dict[str, Coverage]:
    """Why `img` does not run the call, or the program each direction runs there."""
    if img.specific:
        missing = sorted(call.features - frozenset(wheel.arch_specific_features))
        if missing:
            return Reason(
                "feature-unsupported",
                f"{', '.join(missing)} is not supported by the sm {img.target} kernels (they support: "
                f"{', '.join(wheel.arch_specific_features) or 'none listed in the manifest'})",
                f"call without {', '.join(missing)} to use them",
            )
    fwd = _rows(wheel, img, dtype, "fwd")
    if not fwd:
        return Reason(
            "dtype-unsupported",
            f"no {dtype} kernels for sm {img.target} ({img.image})",
            _dtype_fix(dtype, device),
        )
    serving = [row for row in fwd if padded in row.head_dims]
    if not serving:
        return Reason(
            "head-dim-unsupported",
            f"head dim {call.head_dim} (padded {padded}) has no {dtype} kernel for sm {img.target}",
            "use a head dim this wheel covers (`fa doctor` lists them)",
        )
    if call.backward:
        bwd = [row for row in _rows(wheel, img, dtype, "bwd") if padded in row.head_dims]
        if not bwd:
            return Reason(
                "backward-unsupported",
                f"forward is covered but backward for {dtype} head dim {padded} on sm {img.target} is not",
                "call without requires_grad, or use a head dim with backward kernels",
            )
    chosen: dict[str, Coverage] = {}
    for direction, rows in (("fwd", serving), ("bwd", bwd if call.backward else [])):
        if not rows:
            continue
        row = fitting_tile(rows, device.smem_per_block)
        if row is None:
            least = min(rows, key=_need)
            return Reason(
                "arch-unsupported",
                f"the {img.target} {img.image} {direction} kernels for {dtype} head dim {padded} need "
                f"{_need_text(least)} bytes of shared memory per block, {len(rows)} tile(s) tried; "
                f"this GPU (sm {device.sm}) offers {device.smem_per_block}",
                f"use a wheel with SASS for sm {device.sm} (fa build with archs including {device.sm})",
            )
        chosen[direction] = row
    return chosen


def fitting_tile(rows: Sequence[Coverage], smem_per_block: int | None) -> Coverage | None:
    """The program that runs, among those serving one direction and head dim (a default tile and its
    alternatives): the one needing the most shared memory, static and dynamic together, within the
    GPU's opt-in limit per block (`smem_per_block`; None: unknown, every one is taken to fit).
    Alternatives exist only for GPUs below the default's need, so the default wins wherever it fits.
    None: none fits. The one rule for doctor and the runtime."""
    fits = [row for row in rows if smem_per_block is None or _need(row) <= smem_per_block]
    return max(fits, key=_need, default=None)


def _need(row: Coverage) -> int:
    return row.smem_needed or 0


def _need_text(row: Coverage) -> str:
    if row.static_smem:
        return f"{_need(row)} ({row.smem_bytes} dynamic + {row.static_smem} static)"
    return str(_need(row))


def _split_row(
    wheel: WheelInfo, img: _Image, device: Device, dtype: str, padded: int, notes: list[Reason]
) -> Coverage | None:
    """The split-KV program a forward-only call may use on `img`; None with a note saying why none."""
    rows = [row for row in _rows(wheel, img, dtype, "splitkv") if padded in row.head_dims]
    if not rows:
        if any(row.image == img.image and row.direction == "splitkv" for row in wheel.coverage):
            notes.append(_no_split(f"no {dtype} split-KV kernel serves head dim {padded} on sm {img.target}"))
        return None
    row = fitting_tile(rows, device.smem_per_block)
    if row is None:
        least = min(rows, key=_need)
        notes.append(
            _no_split(
                f"the {img.target} {img.image} split-KV kernels for {dtype} head dim {padded} need "
                f"{_need_text(least)} bytes of shared memory per block; this GPU (sm {device.sm}) offers "
                f"{device.smem_per_block}"
            )
        )
    return row


def _no_split(why: str) -> Reason:
    return Reason(
        "splitkv-unavailable",
        f"{why}; decode-shaped calls run the plain forward kernel (fewer blocks in flight)",
        "nothing to do for correctness; a wheel with SASS for this GPU has split-KV kernels that fit it",
    )


def _kernel_file(
    kernels: Sequence[KernelFile], img: _Image, row: Coverage, head_dim: int
) -> KernelFile | None:
    """The kernel file of a chosen program (coverage row): its arch, image, dtype, direction and tile,
    in the smallest head-dim bucket >= the padded head dim."""
    key = (img.arch, img.image, img.specific, row.dtype, row.direction, row.tile)
    fits = [
        k
        for k in kernels
        if (k.arch, k.image, k.arch_specific, k.dtype, k.direction, k.tile) == key and k.head_dim >= head_dim
    ]
    return min(fits, key=lambda k: k.head_dim) if fits else None


def _key_block(kernel: KernelFile) -> int:
    """The keys its main entry reads per block (the combine's 0 aside)."""
    return max((launch.block_n for launch in kernel.entries.values()), default=0)


def _holds_key_blocks(kernel: KernelFile, page_size: int) -> bool:
    """Whether pages of `page_size` keys (0: not paged) hold whole key blocks of the kernel: it reads
    each key block from one page (kernels/csrc/attention.cuh KvRows)."""
    block = _key_block(kernel)
    return page_size == 0 or block == 0 or page_size % block == 0


def _pages_too_small(kernel: KernelFile, page_size: int, arch: str) -> Reason:
    block = _key_block(kernel)
    return Reason(
        "feature-unsupported",
        f"paged_kv with pages of {page_size} keys: the {kernel.dtype} head dim {kernel.head_dim} kernel for "
        f"sm {arch} reads key blocks of {block} keys, each from one page",
        f"use a page_block_size that is a multiple of {block}",
    )


# ---- split-KV: how many shares of the keys -------------------------------------------------------------
MAX_SPLITS = 128  # flash-attn's cap too; fa_fwd_combine loops over any number


def num_splits(
    batch: int,
    heads: int,
    seqlen_q: int,
    seqlen_k: int,
    block_m: int,
    block_n: int,
    sm_count: int,
    blocks_per_sm: int = 2,
    requested: int = 0,
) -> int:
    """How many shares of the key blocks the split-KV forward (fa_fwd_splitkv) splits each (batch, head,
    query block) into; 1 means the plain forward.

    `requested` is flash-attn's `num_splits`: 0 asks this heuristic, n > 0 is taken as given (capped
    at the number of key blocks and MAX_SPLITS). The heuristic is FlashAttention-2's
    (num_splits_heuristic): with enough blocks to nearly fill the GPU (80% of sm_count *
    blocks_per_sm), no split; otherwise the smallest split count whose last wave is at least 85% as
    full as the best one's, among counts that change the key blocks per split. block_m and block_n are
    the split-KV unit's (its manifest entry).
    """
    if requested < 0:
        raise ValueError(f"num_splits: {requested} is negative; 0 picks a split count, 1 disables splitting")
    key_blocks = max(1, -(-seqlen_k // block_n))
    if requested > 0:
        return min(requested, key_blocks, MAX_SPLITS)
    work = batch * heads * -(-seqlen_q // block_m)
    slots = max(1, sm_count * blocks_per_sm)
    if work >= 0.8 * slots:
        return 1
    most = min(MAX_SPLITS, slots, key_blocks)

    def changes_blocks_per_split(n: int) -> bool:
        return n == 1 or -(-key_blocks // n) != -(-key_blocks // (n - 1))

    def last_wave_fill(n: int) -> float:
        waves = work * n / slots
        return waves / math.ceil(waves)

    eligible = [n for n in range(1, most + 1) if changes_blocks_per_split(n)]
    best = max(last_wave_fill(n) for n in eligible)
    return next(n for n in eligible if last_wave_fill(n) >= 0.85 * best)


# ---- the binding and the torch it runs with --------------------------------------------------------


def torch_too_old(version: str) -> Reason | None:
    """torch older than fa supports at all (MIN_TORCH), whichever wheel."""
    if torch_version(version) >= MIN_TORCH:
        return None
    need = version_text(MIN_TORCH)
    return Reason(
        "torch-version-mismatch",
        f"fa-attn needs torch >= {need} (it registers its ops with torch.library APIs from {need}); "
        f"installed is {version}",
        f"upgrade torch to {need} or newer",
    )


STABLE = "stable"  # WheelInfo.binding_form of a binding on torch's stable C ABI (else "aten", or None)


def binding_problems(
    wheel: WheelInfo, torch: str, cxx11abi: bool | None, abi_assumed: bool = False
) -> list[Reason]:
    """Why the wheel's binding cannot load into this torch (its version, its C++ ABI), decided from the
    manifest alone: loading a binding built for another torch can kill the process (`undefined symbol`).
    cxx11abi: torch's, None if unknown (not compared); abi_assumed: it was inferred, not read.

    A binding of the stable form (`binding_form` "stable") uses torch's stable C ABI only: it serves its
    floor (`torch`) and every later torch, nightlies, NGC and local builds included, whatever their C++
    ABI; only a torch older than the floor is refused."""
    if wheel.universal:
        return []
    if wheel.binding_form == STABLE:
        if wheel.torch is not None and torch_version(torch) < torch_version(wheel.torch):
            return [
                Reason(
                    "torch-below-floor",
                    f"the binding uses torch's stable ABI from torch {wheel.torch} on; torch here is {torch}",
                    f"upgrade torch to {wheel.torch} or newer, or install a wheel built for torch "
                    f"{torch_minor(torch)} (`fa install` picks it; `fa install --build` builds it)",
                )
            ]
        return []
    reasons = []
    running = torch_minor(torch)
    if wheel.torch != running:
        reasons.append(
            Reason(
                "torch-version-mismatch",
                f"the binding is built for torch {wheel.torch}; torch here is {torch}",
                f"install the fa-attn wheel built for torch {running} (`fa install` picks it), "
                "or build one with `fa install --build`",
            )
        )
    if wheel.cxx11abi is not None and cxx11abi is not None and wheel.cxx11abi != cxx11abi:
        assumed = " (assumed: the environment does not say)" if abi_assumed else ""
        reasons.append(
            Reason(
                "cxx11abi-mismatch",
                f"the binding uses cxx11abi={str(wheel.cxx11abi).lower()}; torch uses "
                f"cxx11abi={str(cxx11abi).lower()}{assumed}",
                "install the fa-attn wheel with torch's C++ ABI (`fa install` picks it), "
                "or build one with `fa build --local`",
            )
        )
    return reasons


def driver_too_old(wheel: WheelInfo, driver: str | None, floor: str | None = None) -> Reason | None:
    """Why the wheel's kernels cannot run on this driver: older than the floor of its CUDA major
    (`min_driver`; `floor` overrides it, e.g. Windows' own floor). None without a driver to compare
    (that is the stack's `no-gpu`) or for a wheel without kernels."""
    floor = floor or wheel.min_driver
    if floor is None or driver is None or driver_at_least(driver, floor):
        return None
    return Reason(
        "driver-too-old",
        f"the wheel's CUDA {wheel.cuda_major} kernels need driver >= {floor}; this driver is {driver}",
        f"update the NVIDIA driver to >= {floor}, or use a wheel for an older CUDA major",
    )


def untested_torch(wheel: WheelInfo, torch: str) -> Reason | None:
    """A warning, never a refusal: a stable-ABI binding on a torch minor newer than every one it was
    tested with (`torch_tested`). torch's stable ABI promises it loads and runs; fa has not checked."""
    if wheel.binding_form != STABLE or not wheel.torch_tested:
        return None
    newest = max(torch_version(t) for t in wheel.torch_tested)
    if torch_version(torch) <= newest:
        return None
    return Reason(
        "torch-newer-than-tested",
        f"torch {torch} is newer than every torch this stable-ABI binding was tested with "
        f"({', '.join(wheel.torch_tested)}); torch's stable ABI promises it loads and runs, fa has not checked",
        "nothing to do if it works; a newer fa-attn release tests this torch",
    )
