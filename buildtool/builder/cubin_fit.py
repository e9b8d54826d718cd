"""What each kernel of a cubin asks of a launch, read from its ELF, and whether a unit can launch on
the arch it is built for.

A cubin (NVRTC's output for a real arch) is an ELF file; per kernel `k` it holds
  .nv.shared.k   a NOBITS section whose size is k's static shared memory (ptxas's "bytes smem": the
                 sm90+ cubins carry 1 KiB there although fa's sources declare none)
  .nv.info.k     EIATTR records of k: EIATTR_MAX_THREADS (0x05) holds __launch_bounds__' threads
  .nv.info       EIATTR records of the module: EIATTR_REGCOUNT (0x2f) maps k's symbol to its registers
Each EIATTR record starts with a format byte and an attribute byte; format EIFMT_SVAL (0x04) is
followed by a 16-bit size and that many payload bytes, every other format by a 16-bit value.

A launch of k needs static + dynamic shared memory within the arch's per-block opt-in maximum
(tiles.SMEM_LIMIT, static and dynamic together): `check_units` refuses a build whose unit would fail
there, naming the unit, arch, bytes and limit, and one whose static size exceeds what the manifest
records (tiles.static_smem), from which the runtime chooses tiles by the GPU's limit. Not verified on a GPU: the limit is the CUDA
Programming Guide's table, the static figure ptxas's.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildtool.core import cache
from buildtool.errors import FaError

if TYPE_CHECKING:
    from buildtool.builder.compile import KernelTree
    from buildtool.builder.wheel_specs import CompileJob, ReusedSass

_FACTS = "elf-facts"  # the stamps of kernel_needs (keyed with fa's code: a changed parser parses again)
_EIFMT_SVAL = 0x04
_EIATTR_MAX_THREADS = 0x05
_EIATTR_REGCOUNT = 0x2F


class SharedMemoryFitError(FaError):
    """Kernels of a build whose shared memory exceeds the per-block limit of the arch they claim."""


@dataclass(frozen=True)
class KernelNeeds:
    """What one kernel of a cubin asks of its launch."""

    static_smem: int  # bytes
    registers: int  # per thread; 0 if the cubin does not say
    max_threads: int  # __launch_bounds__' threads per block; 0 if none was given


def _records(data: bytes) -> Iterable[tuple[int, bytes]]:
    """(attribute, payload) of each EIATTR record; a non-SVAL record's payload is its 16-bit value."""
    i = 0
    while i + 4 <= len(data):
        fmt, attr = data[i], data[i + 1]
        (word,) = struct.unpack_from("<H", data, i + 2)
        if fmt == _EIFMT_SVAL:
            yield attr, data[i + 4 : i + 4 + word]
            i += 4 + word
        else:
            yield attr, data[i + 2 : i + 4]
            i += 4


def kernel_needs(image: bytes) -> dict[str, KernelNeeds]:
    """Every kernel of a cubin (each has a .nv.info.<kernel> section) and what its launch needs."""
    from elftools.elf.elffile import ELFFile  # here: a build with nothing changed reads stamps (_needs_of)

    elf = ELFFile(io.BytesIO(image))
    symtab: Any = elf.get_section_by_name(".symtab")
    symbols = [s.name for s in symtab.iter_symbols()] if symtab is not None else []
    registers: dict[str, int] = {}
    module_info = elf.get_section_by_name(".nv.info")
    if module_info is not None:
        for attr, payload in _records(module_info.data()):
            if attr == _EIATTR_REGCOUNT and len(payload) >= 8:
                index, count = struct.unpack_from("<II", payload)
                if index < len(symbols):
                    registers[symbols[index]] = count
    out: dict[str, KernelNeeds] = {}
    prefix = ".nv.info."
    for info in elf.iter_sections():
        if not info.name.startswith(prefix):
            continue
        kernel = info.name[len(prefix) :]
        max_threads = 0
        for attr, payload in _records(info.data()):
            if attr == _EIATTR_MAX_THREADS and len(payload) >= 12:
                x, y, z = struct.unpack_from("<III", payload)
                max_threads = x * y * z
        shared = elf.get_section_by_name(f".nv.shared.{kernel}")  # absent: no static shared memory
        static = int(shared["sh_size"]) if shared is not None else 0
        out[kernel] = KernelNeeds(static, registers.get(kernel, 0), max_threads)
    return out


@dataclass(frozen=True)
class UnitImage:
    """One built cubin and what the build promised about it."""

    unit: str
    arch: str  # "12.0"
    path: Path
    dynamic_smem: Mapping[str, int]  # entry -> the launch's dynamic shared memory (tiles.Launch)
    # The static shared memory the manifest records for it (tiles.static_smem): the decision adds it to
    # the dynamic part to choose a tile, so a cubin holding more would be chosen where it cannot launch.
    declared_static: int = 0


def needs_of(paths: Iterable[Path]) -> dict[Path, dict[str, KernelNeeds]]:
    """kernel_needs of each cubin, its ELF parsed once per content (parsing every cubin was most of a
    no-op rebuild's time, issue 37). One stamp holds the table of every cubin looked at: its path ->
    its state (cache.file_state), sha256 and facts, read once and written once when anything changed.
    The same state answers without reading the file, as git's index does; another state reads the
    bytes, and only another sha256 parses them again. Even a compile cache image, named by the key of
    what it is made from, is checked so: an edited one is never answered for by its stamp. Entries not
    as written here, or whose file is gone, are dropped; two builds writing the table at once lose at
    most the other's new entries (parsed again next time)."""
    key = cache.content_key(_FACTS, cache.own_code_hash())
    table = cache.read_stamp(_FACTS, key) or {}
    out: dict[Path, dict[str, KernelNeeds]] = {}
    changed = False
    for path in paths:
        name = os.path.abspath(path)
        entry = table.get(name)
        entry = entry if isinstance(entry, dict) else {}
        needs = _stamped(entry.get("kernels"))
        state = cache.file_state(path)  # before the read: a write meanwhile leaves a state redone next time
        if needs is None or state is None or entry.get("state") != state:
            data = path.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if needs is None or entry.get("sha256") != digest:
                needs = kernel_needs(data)
            kernels = {k: [v.static_smem, v.registers, v.max_threads] for k, v in needs.items()}
            table[name] = {"state": state, "sha256": digest, "kernels": kernels}
            changed = True
        out[path] = needs
    if changed:
        kept = {
            name: entry
            for name, entry in table.items()
            if isinstance(entry, dict)
            and _stamped(entry.get("kernels")) is not None
            and os.path.isabs(name)
            and os.path.isfile(name)
        }
        cache.write_stamp(_FACTS, key, kept)
    return out


def _needs_of(path: Path) -> dict[str, KernelNeeds]:
    return needs_of([path])[path]


def _stamped(kernels: object) -> dict[str, KernelNeeds] | None:
    """The facts of an elf-facts stamp's "kernels", or None when they are not what _needs_of writes."""
    if not isinstance(kernels, dict):
        return None
    out = {}
    for name, facts in kernels.items():
        if not (
            isinstance(facts, list) and len(facts) == 3 and all(type(n) is int and n >= 0 for n in facts)
        ):
            return None
        out[name] = KernelNeeds(*facts)
    return out


def misfits(image: UnitImage, limit: int, needs: Mapping[str, KernelNeeds] | None = None) -> list[str]:
    """One line per entry of `image` whose static + dynamic shared memory exceeds `limit` (`needs`: its
    cubin's kernel_needs, when already read)."""
    needs = _needs_of(image.path) if needs is None else needs
    lines = []
    for entry, dynamic in image.dynamic_smem.items():
        static = needs[entry].static_smem if entry in needs else 0
        if static + dynamic > limit:
            lines.append(
                f"{image.unit} ({entry}) on sm {image.arch}: {static + dynamic} B of shared memory "
                f"({static} static + {dynamic} dynamic) > the {limit} B a block may use"
            )
        elif static > image.declared_static:
            lines.append(
                f"{image.unit} ({entry}) on sm {image.arch}: {static} B of static shared memory > the "
                f"{image.declared_static} B tiles.static_smem records in the manifest"
            )
    return lines


def check_units(images: Iterable[UnitImage], limits: Mapping[str, int]) -> None:
    """Raises SharedMemoryFitError naming every entry that cannot launch on its arch."""
    images = list(images)
    needs = needs_of(image.path for image in images)
    lines = [line for image in images for line in misfits(image, limits[image.arch], needs[image.path])]
    if lines:
        raise SharedMemoryFitError(
            "kernels that cannot launch on the arch they are built for:\n  "
            + "\n  ".join(lines)
            + "\nfix: choose a smaller tile for these units in kernels/tiles.py (or, for a static size the"
            " manifest understates, raise the family's static_smem there)"
        )


def check_build(
    images: Mapping[CompileJob, Path], tree: KernelTree, reused: Iterable[ReusedSass] = ()
) -> None:
    """check_units over a build's cubins (its "sass" jobs) with the tree's SMEM_LIMIT, and each cubin
    a higher minor reuses (wheel_specs.ReusedSass) against that arch's limit too; each with the launch
    of the unit its compiling CUDA major's table gives. PTX is compiled by
    the driver on the user's machine, so its static size is not known at build time."""
    sass = [(job.arch, job) for job in images if job.image == "sass"]
    sass += [(r.arch, r.job) for r in reused if r.job in images]
    # Each cubin against the unit of the major whose NVRTC compiled it (a cu12 wheel's sm_80 cubin may
    # be CUDA 11.8's: wheel_specs.sass_compiler), whose tile is its own where tiles.py has one per major:
    # the unit the compile resolved (KernelTree.unit, which holds each arch and major's table once).
    units = []
    for arch, job in sass:
        entries = tree.unit(arch, job.unit, job.cuda_major).entries
        dynamic = {name: launch.smem_bytes for name, launch in entries.items()}
        declared = tree.tiles.static_smem(arch, "sass")
        units.append(UnitImage(job.unit, arch, images[job], dynamic, declared))
    check_units(units, tree.tiles.SMEM_LIMIT)
