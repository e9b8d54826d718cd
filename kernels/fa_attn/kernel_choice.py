"""Which of a wheel's kernel images runs on a given GPU, or why none does (docs/contracts.md section 4).

Pure and stdlib only: the runtime calls it with the live device, and `fa doctor` loads this same file by
path (buildtool/core/kernels_src.py) for machines described in JSON, so the two can never disagree. It reads
only the manifest's `coverage` (never `kernels`), so an index.json entry works as well as a manifest.

Rules (compat-facts.md, "GPU architectures"): SASS built for X.Y runs on X.Z for Z >= Y, never across
majors, so the best image is the SASS of the device's major with the highest minor <= the device's.
Failing that, PTX whose arch <= the device's can be JIT-compiled by the driver, but only by a driver at
least as new as the toolkit that wrote it (`ptx_min_driver`). Capability is always a range, never an
equality test.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_TORCH = (2, 4)  # ops.py uses torch.library.register_fake / register_autograd, new in torch 2.4
MAX_HEAD_DIM = 256  # flash-attn 2.x's limit; no bucket of ours is larger
HEAD_DIM_ALIGN = 8  # the wrapper pads other head dims up to a multiple of 8

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
}


@dataclass(frozen=True)
class Reason:
    code: str  # stable string, docs/contracts.md section 7
    message: str  # what is wrong, with the numbers that matter
    fix: str  # one line a person can act on


@dataclass(frozen=True)
class Choice:
    path: str  # "sass" | "ptx" | "fallback"
    arch: str | None  # arch of the image that will run ("8.0"); None on fallback
    head_dim: int | None  # head dim the kernel runs with (padded to a multiple of 8); None on fallback
    reasons: tuple[Reason, ...]  # why fallback (empty otherwise)


def normalize_dtype(dtype: str) -> str:
    """ "bf16"/"bfloat16"/"torch.bfloat16" -> "bf16". Raises ValueError for anything that is not a float."""
    canon = _DTYPE_ALIASES.get(str(dtype).lower())
    if canon is None:
        raise ValueError(f"dtype: {dtype!r} is not a floating-point attention dtype; use fp16, bf16 or fp32")
    return canon


def parse_arch(arch: str) -> tuple[int, int]:
    """ "8.6" -> (8, 6); also accepts "sm_86"/"86" as people write them."""
    text = str(arch).strip().lower().removeprefix("sm_").removeprefix("compute_")
    try:
        if "." in text:
            major, minor = text.split(".", 1)
            return int(major), int(minor)
        number = int(text)
    except ValueError:
        raise ValueError(f"sm: {arch!r} is not a compute capability; write it like '8.6'") from None
    return divmod(number, 10)


def parse_driver(version: str) -> tuple[int, ...]:
    """ "575.51.03" -> (575, 51, 3)."""
    try:
        return tuple(int(part) for part in str(version).strip().split("."))
    except ValueError:
        raise ValueError(f"driver: {version!r} is not a driver version; write it like '575.51.03'") from None


def padded_head_dim(head_dim: int) -> int:
    if head_dim <= 0:
        raise ValueError(f"head_dim: {head_dim} must be positive")
    return -(-head_dim // HEAD_DIM_ALIGN) * HEAD_DIM_ALIGN


@dataclass(frozen=True)
class _Image:
    arch: str
    image: str  # "sass" | "ptx"


def _images(manifest: dict) -> list[_Image]:
    seen: dict[tuple[str, str], None] = {}
    for entry in manifest.get("coverage") or []:
        seen[(entry["arch"], entry["image"])] = None
    return [_Image(arch, image) for arch, image in seen]


def _covers(manifest: dict, image: _Image, dtype: str, direction: str, head_dim: int | None) -> bool:
    for entry in manifest.get("coverage") or []:
        if (entry["arch"], entry["image"], entry["dtype"], entry["direction"]) != (
            image.arch,
            image.image,
            dtype,
            direction,
        ):
            continue
        if head_dim is None or head_dim in entry.get("head_dims", []):
            return True
    return False


def _fallback(*reasons: Reason) -> Choice:
    return Choice(path="fallback", arch=None, head_dim=None, reasons=tuple(reasons))


def _wheel_name(manifest: dict) -> str:
    return manifest.get("variant") or manifest.get("file") or manifest.get("version") or "this wheel"


def choose(
    manifest: dict, sm: str | None, dtype: str, head_dim: int, backward: bool, driver: str | None
) -> Choice:
    """The image that will run a call, or the reasons it falls back to torch SDPA.

    manifest: a wheel's manifest.json or an index.json entry. sm: "8.6", None when there is no GPU.
    dtype: "fp16" | "bf16" | "fp32" (aliases accepted). head_dim: the caller's head dim (padded here).
    backward: the call also needs the backward kernels. driver: "575.51.03", None if unknown (then we
    assume the driver can JIT the PTX; the runtime reports a load failure if it cannot).
    """
    dtype = normalize_dtype(dtype)
    if sm is None:
        return _fallback(
            Reason(
                "no-gpu",
                "no NVIDIA GPU is visible",
                "run on a machine with an NVIDIA GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)",
            )
        )
    device = parse_arch(sm)
    if manifest.get("cuda_major") is None or ("binding" in manifest and manifest["binding"] is None):
        return _fallback(
            Reason(
                "binding-unavailable",
                f"{_wheel_name(manifest)} has no kernels or host binding (universal wheel)",
                "install the fa-attn wheel built for your torch and CUDA major (`fa install`)",
            )
        )
    if dtype == "fp32":
        return _fallback(
            Reason(
                "dtype-unsupported",
                "fp32 attention has no kernel (fp16 and bf16 only)",
                "cast q, k, v to torch.bfloat16 or torch.float16",
            )
        )
    if head_dim > MAX_HEAD_DIM:
        return _fallback(
            Reason(
                "head-dim-unsupported",
                f"head dim {head_dim} is larger than {MAX_HEAD_DIM}",
                f"use a head dim <= {MAX_HEAD_DIM}",
            )
        )
    padded = padded_head_dim(head_dim)

    reasons: list[Reason] = []
    sass = [
        img
        for img in _images(manifest)
        if img.image == "sass" and parse_arch(img.arch)[0] == device[0] and parse_arch(img.arch) <= device
    ]
    sass.sort(key=lambda img: parse_arch(img.arch), reverse=True)
    ptx = [img for img in _images(manifest) if img.image == "ptx" and parse_arch(img.arch) <= device]
    ptx.sort(key=lambda img: parse_arch(img.arch), reverse=True)
    min_driver = manifest.get("ptx_min_driver")
    if ptx and driver is not None and min_driver and parse_driver(driver) < parse_driver(min_driver):
        reasons.append(
            Reason(
                "ptx-driver-too-old",
                f"no SASS for sm {sm}; the PTX (compute {ptx[0].arch}) needs driver >= {min_driver}, found {driver}",
                f"update the NVIDIA driver to >= {min_driver}, or install a wheel with SASS for sm {sm}",
            )
        )
        ptx = []
    candidates = [(img, "sass") for img in sass] + [(img, "ptx") for img in ptx]

    if not candidates:
        if not reasons:
            archs = ", ".join(sorted({img.arch for img in _images(manifest)}, key=parse_arch)) or "none"
            reasons.append(
                Reason(
                    "arch-unsupported",
                    f"no kernel image runs on sm {sm} (SASS/PTX built for: {archs})",
                    f"install a wheel built for sm {sm}, or a newer one with PTX <= {sm}",
                )
            )
        return _fallback(*reasons)

    # Walk the images best-first; the first one that covers the whole call wins. Otherwise report the
    # gap of the best image, which is the one a fix (a wheel with more coverage) would use.
    gaps: list[Reason] = []
    for img, path in candidates:
        if not _covers(manifest, img, dtype, "fwd", None):
            gaps.append(
                Reason(
                    "dtype-unsupported",
                    f"no {dtype} kernels for sm {img.arch} ({path})",
                    "use fp16 (sm 7.5 has no bf16 tensor cores) or a wheel with these kernels",
                )
            )
        elif not _covers(manifest, img, dtype, "fwd", padded):
            gaps.append(
                Reason(
                    "head-dim-unsupported",
                    f"head dim {head_dim} (padded {padded}) has no {dtype} kernel for sm {img.arch}",
                    "use a head dim this wheel covers (`fa doctor` lists them)",
                )
            )
        elif backward and not _covers(manifest, img, dtype, "bwd", padded):
            gaps.append(
                Reason(
                    "backward-unsupported",
                    f"forward is covered but backward for {dtype} head dim {padded} on sm {img.arch} is not",
                    "call without requires_grad, or use a head dim with backward kernels",
                )
            )
        else:
            return Choice(path=path, arch=img.arch, head_dim=padded, reasons=())
    return _fallback(*reasons, gaps[0])


def kernel_entry(manifest: dict, choice: Choice, dtype: str, direction: str) -> dict | None:
    """The manifest `kernels` item that runs a chosen call: the smallest head-dim bucket >= the padded
    head dim of the chosen arch and image. None when the manifest has no such entry (index.json)."""
    if choice.path == "fallback" or choice.head_dim is None:
        return None
    dtype = normalize_dtype(dtype)
    fits = [
        k
        for k in manifest.get("kernels") or []
        if k["arch"] == choice.arch
        and k["image"] == choice.path
        and k["dtype"] == dtype
        and k["direction"] == direction
        and k["head_dim"] >= choice.head_dim
    ]
    return min(fits, key=lambda k: k["head_dim"]) if fits else None
