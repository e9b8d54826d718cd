"""Wheels: one per WheelSpec, `fa_attn-<version>-py3-none-<platform>.whl`.

Contents: the runtime (kernels/fa_attn/), the binding, one cubin per (arch, unit), the PTX of the
newest arch, and fa_attn/manifest.json (docs/contracts.md section 3) which says what is inside.
The wheel is reproducible: entries sorted, every timestamp fixed, fixed permissions, so the same
inputs give the same bytes. METADATA has no Requires-Dist on torch on purpose: installing fa-attn
must never make pip replace the user's torch (the runtime checks torch itself).
The wheel is written under a temporary name beside its final one and renamed when whole.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from buildtool.builder import out_files
from buildtool.builder.platform_tag import platform_tag
from buildtool.builder.wheel_specs import units_per_major
from buildtool.core import atomic, cache, cuda_facts, kernels_src
from buildtool.core.cuda_facts import TOOLKITS, compute_name, sm_name
from buildtool.core.runtime import schema, versions
from buildtool.core.wheel_file import REQUIRES_PYTHON
from buildtool.errors import FaError, UsageError

if TYPE_CHECKING:
    from buildtool.builder.wheel_specs import CompileJob, ReusedSass, WheelSpec

_EPOCH = (1980, 1, 1, 0, 0, 0)  # the zip format's earliest date: no build time leaks in
SUMMARY = "Fused attention kernels for PyTorch, built per CUDA major and torch minor by fa"


class PackageError(FaError):
    """A wheel that cannot be assembled (a missing artifact)."""


class OutDirError(UsageError):
    """An output folder fa refuses to write wheels into; the message says why and what to pass instead."""


def check_out_dir(out_dir: Path, kernels_root: Path) -> None:
    """Refuse an output folder inside the kernels tree a wheel is packed from (its fa_attn/ package is
    copied into every wheel, so wheels written there would be packed into the next ones) or inside fa's
    own package. Symlinks are resolved first."""
    out = out_dir.resolve()
    sources = (
        (kernels_root.resolve(), "the kernels source tree the wheels are built from"),
        (Path(__file__).resolve().parents[1], "fa's own package"),
    )
    for root, what in sources:
        if out == root or out.is_relative_to(root):
            raise OutDirError(
                f"--out {out_dir}: inside {what} ({root}); wheels written there would end up in the "
                "next wheel built from it\n  fix: pass a folder outside it, e.g. --out wheels"
            )


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    platform: str  # the platform tag
    platform_reason: str  # why that tag (build log)
    manifest: schema.Manifest | None  # None: found unchanged since fa wrote it (`reused`), not assembled


# A wheel's stamp (core/cache.py): what fa wrote for inputs named by a content key, and the file's
# state then. A build with nothing changed finds each wheel there as written and assembles none of
# them: no manifest, no image read, no hashing (bench/build/build.py --noop).
_STAMPS = "wheels"


_TREE_STATES: dict[Path, str] | None = None  # within `one_tree_state()`: each tree's state, looked at once


def tree_state(root: Path) -> str:
    """Every file of a kernels tree (tiles.py, csrc/, binding/, the runtime package), by path and state."""
    if _TREE_STATES is not None and root in _TREE_STATES:
        return _TREE_STATES[root]
    state = json.dumps(
        [
            (p.relative_to(root).as_posix(), cache.file_state(p))
            for p in sorted(root.rglob("*"))
            if "__pycache__" not in p.parts and p.is_file()
        ]
    )
    if _TREE_STATES is not None:
        _TREE_STATES[root] = state
    return state


@contextlib.contextmanager
def one_tree_state() -> Iterator[None]:
    """Within it, wheel_key looks at a kernels tree's files once (a build packs its wheels from sources
    it does not change meanwhile); outside, at every call."""
    global _TREE_STATES  # a memo scoped by this context manager
    saved, _TREE_STATES = _TREE_STATES, {}
    try:
        yield
    finally:
        _TREE_STATES = saved


def wheel_key(out_dir: Path, spec: object, kernels_root: Path, inputs: list[Path]) -> str:
    """The content key of a wheel: fa's code, the folder, the spec, the kernels tree, the auditwheel
    policies that pick its tag, and each input file (images, bindings) by path and state. Images and
    bindings are cache files named by the content key of what they are made from."""
    parts: list[str] = [
        "fa-wheel",
        cache.own_code_hash(),
        str(out_dir.resolve()),
        repr(spec),
        tree_state(kernels_root),
        auditwheel_version(),
    ]
    # Every input by path and state, the compile cache's images too: their names are the keys of what
    # they are made from, not of their bytes, so one edited there must still make the wheel again.
    parts += [f"{p}\0{cache.input_state(p)}" for p in inputs]
    return cache.content_key(*parts)


@functools.cache
def auditwheel_version() -> str:
    try:
        return importlib.metadata.version("auditwheel")
    except importlib.metadata.PackageNotFoundError:
        return ""


def reused(out_dir: Path, key: str) -> BuiltWheel | None:
    """The wheel of `key` when it is in `out_dir` exactly as fa wrote it there (same state, its sha256 in
    out_files' record); None: build it."""
    stamp = cache.read_stamp(_STAMPS, key)
    if stamp is None or not isinstance(stamp.get("name"), str):
        return None
    name = stamp["name"]
    dest = out_files.inside(out_dir, name)
    if cache.file_state(dest) != stamp.get("state") or stamp.get("sha256") not in out_files.written(
        out_dir
    ).get(name, []):
        return None
    return BuiltWheel(dest, str(stamp.get("platform")), str(stamp.get("reason")), None)


def remember(out_dir: Path, key: str, built: BuiltWheel) -> BuiltWheel:
    """Stamps `built` (just written or checked by write_wheel) for `reused`; returns it."""
    recorded = out_files.written(out_dir).get(built.path.name, [])
    if recorded:
        stamp = {
            "name": built.path.name,
            "platform": built.platform,
            "reason": built.platform_reason,
            "state": cache.file_state(built.path),
            "sha256": recorded[-1],
        }
        cache.write_stamp(_STAMPS, key, stamp)
    return built


def kernel_file(job: CompileJob) -> str:
    """Where an image sits inside fa_attn/: kernels/sm_80/<unit>.cubin or kernels/compute_120/<unit>.ptx."""
    if job.image == "sass":
        return f"kernels/{sm_name(job.arch)}/{job.unit}.cubin"
    return f"kernels/{compute_name(job.arch)}/{job.unit}.ptx"


def images_by_arch(jobs: Sequence[CompileJob], reused: Sequence[ReusedSass]) -> list[tuple[str, CompileJob]]:
    """(the arch a manifest entry is for, the job whose image file it names), in the manifest's order:
    each job for its own arch, and each reused unit (wheel_specs.ReusedSass) for its arch with the
    lower minor's cubin."""
    rows = [(j.arch, j) for j in jobs] + [(r.arch, r.job) for r in reused]
    return sorted(rows, key=lambda row: (versions.parse_target(row[0]), row[1].image, row[1].unit))


def manifest(spec: WheelSpec, tiles: ModuleType, source_sha256: str | None = None) -> schema.Manifest:
    """The manifest of `spec` (contracts section 3); the universal wheel's for a spec without CUDA.
    `source_sha256`: kernels_src.source_hash of the kernels/ tree the wheel is built from."""
    if spec.cuda_major is None:
        return schema.Manifest(info=schema.universal_info(spec.version), kernels=())
    tk = TOOLKITS[spec.cuda_major]
    kernels, coverage = kernel_entries(
        spec.compile_jobs,
        spec.reused_sass,
        tiles,
        kernel_file,
        # another major's NVRTC compiled it (wheel_specs.sass_compiler): the manifest names that major
        lambda job: job.cuda_major if job.cuda_major != spec.cuda_major else None,
    )
    info = schema.WheelInfo(
        version=spec.version,
        variant=spec.variant,
        platform=spec.platform,
        cuda_major=spec.cuda_major,
        toolkit=tk.version,
        min_driver=tk.min_driver,
        ptx_min_driver=ptx_min_driver(spec.compile_jobs),
        sass=cuda_facts.plain(spec.sass),
        ptx=spec.ptx,
        torch=spec.torch_minor,
        cxx11abi=spec.cxx11abi,
        binding=schema.BINDING_FILE,
        binding_form=spec.form,
        torch_tested=spec.torch_tested,
        features=tuple(sorted(getattr(tiles, "FEATURES", ()))),
        coverage=tuple(coverage),
    )
    specific, features = arch_specific_info(spec.compile_jobs, tiles)
    info = dataclasses.replace(info, arch_specific=specific, arch_specific_features=features)
    return schema.Manifest(info=info, kernels=tuple(kernels), source_sha256=source_sha256)


def kernel_entries(
    jobs: Sequence[CompileJob],
    reused: Sequence[ReusedSass],
    tiles: ModuleType,
    file_of: Callable[[CompileJob], str],
    major_of: Callable[[CompileJob], int | None],
) -> tuple[list[schema.KernelFile], list[schema.Coverage]]:
    """The manifest's kernel files and coverage for the images of `jobs` and the units `reused` serves
    (images_by_arch's order), a per-variant wheel's or one kernel set of the all-wheel's: `file_of` is
    where a job's image sits inside fa_attn/, `major_of` the `cuda_major` its entry carries."""
    # tiles.all_units() builds an arch's table: once per arch and the major whose NVRTC compiled the
    # image (its unit, and so its tile, is that major's where the table has a tile per major)
    all_units = units_per_major(tiles.all_units)
    by_name = functools.cache(lambda arch, major: {u.name: u for u in all_units(arch, major)})
    kernels: list[schema.KernelFile] = []
    coverage: list[schema.Coverage] = []
    for arch, job in images_by_arch(jobs, reused):
        unit = by_name(arch, job.cuda_major).get(job.unit)
        if unit is None:
            raise PackageError(
                f"tiles.units({arch!r}) has no unit {job.unit!r} for CUDA {job.cuda_major} "
                "(plan and tiles.py disagree)"
            )
        kernel = kernel_of(unit, arch, job.image, file_of(job), tiles.static_smem(arch, job.image))
        kernel = dataclasses.replace(kernel, cuda_major=major_of(job))
        kernels.append(kernel)
        coverage.append(coverage_of(kernel, tiles.head_dims(unit)))
    return kernels, coverage


def ptx_min_driver(jobs: Sequence[CompileJob]) -> str | None:
    """The driver that JITs the PTX among `jobs`: that of the newest toolkit that wrote any of it (a
    cu12 wheel's compute 9.0 PTX from NVRTC 11.8 JITs from 520.61.05 on, 12.9's from 575.51.03);
    None without PTX."""
    majors = [j.cuda_major for j in jobs if j.image == "ptx"]
    return TOOLKITS[max(majors)].ptx_min_driver if majors else None


def arch_specific_info(
    jobs: Sequence[CompileJob], tiles: ModuleType
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """WheelInfo's (and a KernelSet's) arch-specific fields for the programs `jobs` compile: the
    "9.0a"-like targets among them, and what their units implement (kernels/tiles.py features(); the
    intersection over the targets)."""
    specific = tuple(
        sorted({j.arch for j in jobs if versions.arch_specific(j.arch)}, key=versions.parse_target)
    )
    if not specific:
        return (), ()
    features = set(getattr(tiles, "FEATURES", ()))
    for target in specific:
        features &= set(tiles.features(target))
    return specific, tuple(sorted(features))


def kernel_of(unit: Any, arch: str, image: str, file: str, static_smem: int = 0) -> schema.KernelFile:
    """The manifest's record of a tiles.KernelUnit compiled for `arch` into `file`; `static_smem`:
    tiles.static_smem of its image, which each entry carries beside its dynamic shared memory."""
    entries = {
        name: schema.Launch(
            launch.threads,
            launch.block_m,
            launch.block_n,
            launch.smem_bytes,
            launch.grid,
            static_smem,
        )
        for name, launch in unit.entries.items()
    }
    return schema.KernelFile(
        versions.target_arch(arch),
        image,
        file,
        unit.name,
        unit.direction,
        unit.dtype,
        unit.head_dim,
        entries,
        arch_specific=versions.arch_specific(arch),
        tile=unit.tile,
    )


def coverage_of(kernel: schema.KernelFile, head_dims: list[int]) -> schema.Coverage:
    """What a kernel file serves: the head dims tiles.head_dims() gives its unit, its shared memory and
    its tile (the decision chooses among the tiles serving a head dim by the GPU's shared memory)."""
    need = max(
        kernel.entries.values(), key=lambda launch: launch.smem_bytes + launch.static_smem, default=None
    )
    return schema.Coverage(
        kernel.arch,
        kernel.image,
        kernel.dtype,
        kernel.direction,
        tuple(head_dims),
        kernel.smem_bytes,
        arch_specific=kernel.arch_specific,
        static_smem=need.static_smem if need else 0,
        tile=kernel.tile,
    )


def wheel_name(version: str, platform: str) -> str:
    return f"{schema.DIST}-{version}-py3-none-{platform}.whl"


def _metadata(version: str) -> str:
    return (
        f"Metadata-Version: 2.1\nName: {schema.PACKAGE}\nVersion: {version}\nSummary: {SUMMARY}\n"
        f"Requires-Python: {REQUIRES_PYTHON}\n"
    )


def _wheel_file(platform: str) -> str:
    purelib = "true" if platform == "any" else "false"
    return f"Wheel-Version: 1.0\nGenerator: fa build\nRoot-Is-Purelib: {purelib}\nTag: py3-none-{platform}\n"


def _record(files: Mapping[str, bytes], digests: Mapping[str, bytes], record_path: str) -> bytes:
    """RECORD (PEP 376/427): every file with its urlsafe-base64 sha256 (`digests`) and size; RECORD
    itself bare. Written here rather than by wheel.WheelFile, which stamps RECORD with the current time."""
    lines = []
    for arc in sorted(files):
        digest = base64.urlsafe_b64encode(digests[arc]).rstrip(b"=").decode()
        lines.append(f"{arc},sha256={digest},{len(files[arc])}")
    lines.append(f"{record_path},,")
    return ("\n".join(lines) + "\n").encode()


def runtime_files(kernels_root: Path) -> dict[str, bytes]:
    """The runtime package as shipped: kernels/fa_attn/ minus caches and any dev manifest."""
    src = kernels_root / schema.DIST
    if not (src / "__init__.py").is_file():
        raise PackageError(f"no runtime package at {src} (kernels/fa_attn/__init__.py missing)")
    out = {}
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src).as_posix()
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc" and rel != "manifest.json":
            out[f"{schema.DIST}/{rel}"] = p.read_bytes()
    return out


def build_wheel(
    spec: WheelSpec,
    out_dir: Path,
    kernels_root: Path,
    tiles: ModuleType,
    images: Mapping[CompileJob, Path],
    binding: Path | None,
) -> BuiltWheel:
    if spec.cuda_major is not None and binding is None:
        raise PackageError(f"wheel {spec.variant}: the binding was not built")
    for job in spec.compile_jobs:
        if job not in images:
            raise PackageError(f"wheel {spec.variant}: no image for {job.unit} on {job.arch}")
    inputs = [images[job] for job in spec.compile_jobs] + ([binding] if binding else [])
    key = wheel_key(out_dir, spec, kernels_root, inputs)
    if (same := reused(out_dir, key)) is not None:
        return same
    man = manifest(spec, tiles, kernels_src.source_hash(kernels_root))
    files = runtime_files(kernels_root)
    if spec.cuda_major is None:
        platform, reason = "any", "universal wheel: pure Python, no binaries"
    else:
        if binding is None:
            raise PackageError(f"wheel {spec.variant}: the binding was not built")
        tag = platform_tag([binding])
        if not tag.tag.endswith("_" + str(spec.platform)):
            raise PackageError(
                f"wheel {spec.name}: the binding {binding} is {tag.tag}, not a {spec.platform} binary "
                f"(check CXX / FA_CXX_{str(spec.platform).upper()})"
            )
        platform, reason = tag.tag, tag.reason
        files[f"{schema.DIST}/{schema.BINDING_FILE}"] = binding.read_bytes()
        for job in spec.compile_jobs:
            if job not in images:
                raise PackageError(f"wheel {spec.variant}: no image for {job.unit} on {job.arch}")
            files[f"{schema.DIST}/{kernel_file(job)}"] = images[job].read_bytes()
    dest = write_wheel(files, man, spec.version, platform, out_dir)
    return remember(out_dir, key, BuiltWheel(dest, platform, reason, man))


def write_wheel(
    files: dict[str, bytes], man: schema.Manifest, version: str, platform: str, out_dir: Path
) -> Path:
    """The wheel of `files` (the fa_attn/ package) with its manifest, METADATA, WHEEL and RECORD,
    written whole under its final name; skipped when the same wheel is there already."""
    # Not sort_keys: a kernel's "entries" are in launch order (fa_bwd_preprocess, fa_bwd,
    # fa_bwd_convert_dq), which sorting would turn into fa_bwd first. to_json() writes every object in
    # a fixed order (the schema's fields), so the bytes stay reproducible.
    files[schema.MANIFEST_PATH] = (json.dumps(man.to_json(), indent=2) + "\n").encode()
    dist_info = f"{schema.DIST}-{version}.dist-info"
    files[f"{dist_info}/METADATA"] = _metadata(version).encode()
    files[f"{dist_info}/WHEEL"] = _wheel_file(platform).encode()

    record_arc = f"{dist_info}/RECORD"
    digests = {arc: hashlib.sha256(data).digest() for arc, data in files.items()}
    files[record_arc] = _record(files, digests, record_arc)
    digests[record_arc] = hashlib.sha256(files[record_arc]).digest()
    name = wheel_name(version, platform)
    # A wheel of this name that fa did not write is refused, never replaced; one fa wrote that changed
    # since (tampered) is set aside, kept, and written again.
    out_files.set_aside_if_changed(out_dir, name)
    dest = out_files.claim(out_dir, name)
    if not _same_wheel(dest, record_arc, files[record_arc]):
        with out_files.writing(out_dir, name) as tmp:
            try:
                _write_zip(tmp, files, digests, dist_info)
            except OSError as e:  # a full disk, a quota: name the wheel, not the temporary
                raise atomic.WriteError(dest, e) from e
    # Wheels of other platform tags (an earlier linux_x86_64 build, another machine's manylinux_2_34)
    # stay: they are indexed beside this one, and fit picks by the machine's glibc.
    return dest


# The zip format's records, as zipfile writes them for a small member (no zip64, no extra field).
_LOCAL = struct.Struct("<4s2B4HL2L2H")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_END = struct.Struct("<4s4H2LH")
_VERSION = 20  # "made by" and "needed to extract": deflate (APPNOTE 4.4.3)
_UNIX = 3  # "made by" system: the modes in external_attr are Unix modes
_UTF8_NAME = 0x800  # general purpose bit 11: the name is UTF-8


def _dos_time(date_time: tuple[int, int, int, int, int, int]) -> tuple[int, int]:
    y, mo, d, h, mi, s = date_time
    return h << 11 | mi << 5 | s // 2, (y - 1980) << 9 | mo << 5 | d


# Each member's deflated bytes by the sha256 of its contents, across the wheels of this process: a
# release packs each cubin into every wheel of its CUDA major (up to eleven per-variant wheels) and the
# all-wheel, and deflate was the most CPU fa's own process spent in a cold build. The same bytes in
# give the same bytes out, so a member is compressed once. Bounded: dropped whole past _MEMO_BYTES.
_DEFLATED: dict[bytes, tuple[int, bytes]] = {}
_MEMO_BYTES = 256 * 1024 * 1024
_memo_size = 0


def _deflated(data: bytes, digest: bytes) -> tuple[int, bytes]:
    """(CRC-32, raw deflate stream) of `data` whose sha256 is `digest`: zlib's default level, as
    zipfile's ZIP_DEFLATED writes it."""
    global _memo_size  # the memo's size, kept beside it
    if (found := _DEFLATED.get(digest)) is not None:
        return found
    packer = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
    made = (zlib.crc32(data), packer.compress(data) + packer.flush())
    if _memo_size + len(made[1]) > _MEMO_BYTES:
        _DEFLATED.clear()
        _memo_size = 0
    _DEFLATED[digest] = made
    _memo_size += len(made[1])
    return made


def _write_zip(path: Path, files: Mapping[str, bytes], digests: Mapping[str, bytes], dist_info: str) -> None:
    """The zip of `files`, byte for byte what zipfile.ZipFile.writestr writes for them (deflated, every
    date _EPOCH, mode 0644 or 0755 for .so) on a Unix host, with each member's deflate stream taken
    from `_deflated` (`digests`: each file's sha256). tests/builder/test_wheel_zip.py compares them."""
    dos_time, dos_date = _dos_time(_EPOCH)
    central = []
    offset = 0
    with open(path, "wb") as f:
        # .dist-info last, RECORD last of all (PEP 427's recommended order)
        for arc in sorted(files, key=lambda a: (a.startswith(dist_info), a.endswith("/RECORD"), a)):
            data = files[arc]
            crc, deflated = _deflated(data, digests[arc])
            try:
                name, flags = arc.encode("ascii"), 0
            except UnicodeEncodeError:
                name, flags = arc.encode(), _UTF8_NAME
            # flags .. name length: the fields the local header and the central directory share
            head = (flags, zipfile.ZIP_DEFLATED, dos_time, dos_date, crc, len(deflated), len(data), len(name))
            f.write(_LOCAL.pack(b"PK\x03\x04", _VERSION, 0, *head, 0) + name + deflated)
            mode = (0o755 if arc.endswith(".so") else 0o644) << 16
            central.append(
                _CENTRAL.pack(b"PK\x01\x02", _VERSION, _UNIX, _VERSION, 0, *head, 0, 0, 0, 0, mode, offset)
            )
            central.append(name)
            offset += _LOCAL.size + len(name) + len(deflated)
        directory, count = b"".join(central), len(central) // 2
        if count > 0xFFFF or offset + len(directory) > 0xFFFFFFFF:  # past the format without zip64
            raise PackageError(f"{path.name}: {count} files, {offset} bytes: too large for a wheel fa writes")
        f.write(directory)
        f.write(_END.pack(b"PK\x05\x06", 0, 0, count, count, len(directory), offset, 0))


def _same_wheel(dest: Path, record_arc: str, record: bytes) -> bool:
    """True when `dest` already holds these files: its RECORD hashes every file, and our wheels are
    reproducible (fixed order, timestamps and modes), so rewriting it would give the same bytes. This
    is what makes a build with nothing changed skip the compression of every wheel."""
    try:
        with zipfile.ZipFile(dest) as zf:
            return zf.read(record_arc) == record
    except (OSError, KeyError, zipfile.BadZipFile):
        return False
