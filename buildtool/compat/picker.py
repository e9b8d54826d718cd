"""The index page's picker: every machine it offers, answered by choose.select as `fa doctor` answers it.

The page (buildtool/builder/index_page.py) embeds these answers and only looks them up, so it has no rule
of its own. A machine is (OS and CPU, torch minor, torch's CUDA major, torch's C++ ABI, Python, GPU,
driver); each axis offers only the values that can change an answer, so that every combination can be
asked at index time:

- driver: the ranges between the floors that the wheels and toolkits name (each CUDA major's SASS and
  PTX floors, which torch's own CUDA build needs too). Every rule compares the driver with one of these
  floors, so a range has one answer; it is asked at the range's lowest driver, which its messages show.
- GPU: one compute capability per family (GPU_FAMILIES): SASS, shared memory and PTX are decided per
  compute capability, and the family's GPUs share it.
- torch: by minor (a binding serves a minor), with the CUDA majors of the wheels that serve it, torch's
  C++ ABI where that minor's wheels differ in it, and one minor below fa's floor (versions.MIN_TORCH).
- Python: grouped by what every wheel says of it (its tags and Requires-Python, from fit.wheel_reasons):
  Pythons that every wheel treats the same share their answers. Nothing else in a choice reads Python.

- glibc (Linux): the ranges between the floors the wheels' manylinux tags name, and one below them all.

Each machine is answered for fp16 and for bf16 (`DTYPES`: the page's dtype choice), with `fa doctor`'s
by_dtype, and every fix is read against the whole index (index_fixes.py) as doctor reads it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from buildtool.compat import doctor, index_fixes
from buildtool.compat.choose import Memo, Reason, Request, Selection, select
from buildtool.compat.env import Env, Gpu
from buildtool.compat.fit import TagIndex, supported_tags, wheel_reasons
from buildtool.core import install_lines
from buildtool.core.console import size_text
from buildtool.core.cpus import AARCH64, PLATFORMS, X86_64, canonical
from buildtool.core.cuda_facts import TOOLKITS
from buildtool.core.installed import TorchInfo
from buildtool.core.runtime import schema, versions

# Shell-safe (shlex.quote leaves it bare), so the page can put its own folder's URL in its place.
BASE_URL = "https://fa-index.invalid/base"

# Compute capabilities the picker offers, one per family, newest first, with the GPUs people know by name
# (docs/reference/compat-facts: SASS of X.Y runs on X.Z >= Y, so a family shares its answers; each is
# asked at the first compute capability named). The Jetsons only on aarch64, the CPU they have.
GPU_FAMILIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("12.0", "sm 12.0, 12.1: RTX 50xx, RTX PRO 6000, GB10 (Blackwell)", (X86_64, AARCH64)),
    ("11.0", "sm 11.0: Jetson Thor", (AARCH64,)),
    ("10.0", "sm 10.0, 10.3: B200, GB200, B300, GB300 (Blackwell)", (X86_64, AARCH64)),
    ("9.0", "sm 9.0: H100, H200, H800, GH200 (Hopper)", (X86_64, AARCH64)),
    ("8.9", "sm 8.9: L4, L40, L40S, RTX 40xx, RTX 6000 Ada", (X86_64, AARCH64)),
    ("8.7", "sm 8.7: Jetson Orin", (AARCH64,)),
    ("8.6", "sm 8.6: A10, A40, RTX 30xx, RTX A6000 (Ampere)", (X86_64, AARCH64)),
    ("8.0", "sm 8.0: A100, A800, A30 (Ampere)", (X86_64, AARCH64)),
    ("7.5", "sm 7.5: T4, RTX 20xx, Quadro RTX (Turing)", (X86_64, AARCH64)),
    ("7.0", "sm 7.0 and older: V100, P100, GTX 10xx", (X86_64, AARCH64)),
)
NO_GPU = "none"

# The CPython minors offered, newest first: from fa-attn's Requires-Python floor (3.9) on; free-threaded
# from 3.13. Grouped by what the wheels say of them (python_groups), so more cost nothing.
PYTHONS = ("3.15", "3.15t", "3.14", "3.14t", "3.13", "3.13t", "3.12", "3.11", "3.10", "3.9")
DEFAULT_PYTHON = "3.12"

OS_LABELS = {"linux": "Linux", "windows": "Windows", "darwin": "macOS"}
CPU_NOTES = {AARCH64: " (Arm: GH200, GB200, Jetson, DGX Spark)"}
CPU_TORCH = "cpu"  # the CUDA option of a CPU-only torch
AUTO_ABI = "auto"  # the ABI option where the minor's wheels do not differ in it (fit assumes it)
NO_DRIVER = "none"

# The one-line commands that tell each answer, shown beside the picker.
TELL = {
    "torch": 'python -c "import torch; print(torch.__version__, torch.version.cuda, '
    'torch._C._GLIBCXX_USE_CXX11_ABI)"',
    "python": "python -VV",
    "gpu": "nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader",
}


@dataclass(frozen=True)
class Option:
    id: str
    label: str


@dataclass(frozen=True)
class Machine:
    """One combination the picker offers: its key (an option id per axis) and the Env it stands for."""

    key: tuple[str, ...]  # platform, glibc, torch, cuda, abi, python group, gpu, driver
    env: Env


AXES = ("platform", "glibc", "torch", "cuda", "abi", "python", "gpu", "driver")
# The dtypes each machine is answered for (the page's dtype choice), and the one it opens on.
DTYPES = doctor.BOTH_DTYPES
DEFAULT_DTYPE = "bf16"
# The machine the page opens on, where the first option of an axis is not the most common one: an
# H100 (the first family is the newest, RTX 50xx).
DEFAULTS = {"gpu": "9.0", "python": DEFAULT_PYTHON, "dtype": DEFAULT_DTYPE}
NO_GLIBC = "none"  # the glibc option of an OS without glibc (Windows)


# ---------------------------------------------------------------------------------------------------
# The axes, from the wheels


def glibc_floors(entries: Sequence[schema.IndexEntry]) -> list[tuple[int, int]]:
    """The glibc each Linux wheel's manylinux tag asks for, oldest first (manylinux2014 is 2.17)."""
    needs = set()
    for entry in entries:
        tag = entry.platform_tag or ""
        if tag.startswith("manylinux2014"):
            needs.add((2, 17))
        for match in re.finditer(r"manylinux_(\d+)_(\d+)_", tag):
            needs.add((int(match[1]), int(match[2])))
    return sorted(needs)


def glibc_options(entries: Sequence[schema.IndexEntry]) -> list[tuple[Option, str]]:
    """(option, the glibc it is asked at), newest first: one range from each floor a wheel's tag names up
    to the next, and one below them all. Every tag compares glibc with one of these floors, so a range
    has one answer (Linux wheels without a manylinux tag: one range, any glibc)."""
    floors = glibc_floors(entries)
    if not floors:
        return [(Option("any", "any"), "2.39")]
    text = ["{}.{}".format(*f) for f in floors]
    options = []
    for i, floor in enumerate(text):
        if i + 1 == len(floors):
            label = f"{floor} or newer"
        else:
            upper = floors[i + 1]
            label = f"{floor} to {upper[0]}.{upper[1] - 1}" if upper[1] else f"{floor} to {upper[0] - 1}.x"
        options.append((Option(floor, label), floor))
    lowest = floors[0]
    below = f"{lowest[0]}.{lowest[1] - 1}" if lowest[1] else f"{lowest[0] - 1}.99"
    options.insert(0, (Option(below, f"older than {text[0]}"), below))
    return list(reversed(options))


def driver_floors(entries: Sequence[schema.IndexEntry], os_name: str) -> list[str]:
    """Every driver floor a rule may compare with, oldest first: the toolkits' (torch's own CUDA build,
    SASS and PTX) and the wheels' own."""
    floors = set()
    for toolkit in TOOLKITS.values():
        floors |= {toolkit.windows_min_driver if os_name == "windows" else toolkit.min_driver}
        floors |= {toolkit.ptx_min_driver}
    for entry in entries:
        info = entry.info
        floors |= {d for d in (info.min_driver, info.ptx_min_driver) if d}
        floors |= {d for k in info.kernel_sets for d in (k.min_driver, k.ptx_min_driver) if d}
    return sorted(floors, key=versions.parse_driver)


def driver_options(floors: Sequence[str]) -> list[tuple[Option, str]]:
    """(option, the driver it is asked at): one range per floor, newest first, then one below them all,
    labelled as nvidia-smi prints a driver ("575.51.03 to 580.65.05")."""
    options = []
    for i, floor in enumerate(floors):
        upper = f" to {_just_below(floors[i + 1])}" if i + 1 < len(floors) else " or newer"
        options.append((Option(floor, f"{floor}{upper}"), floor))
    lowest = versions.parse_driver(floors[0])
    below = f"{lowest[0] - 1}.0" if lowest[1:] == (0, 0) else f"{lowest[0]}.0"
    return [*reversed(options), (Option(below, f"older than {floors[0]}"), below)]


def _just_below(driver: str) -> str:
    """The last driver number below `driver` as people read one: 580.65.06 -> 580.65.05, 580 -> 579.x."""
    parts = driver.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if int(parts[i]) > 0:
            width = len(parts[i])
            lower = [*parts[:i], str(int(parts[i]) - 1).zfill(width)]
            return ".".join(lower) + (".x" if i + 1 < len(parts) or len(parts) == 1 else "")
    return driver


def _minor_key(minor: str) -> tuple[int, int]:
    return versions.torch_version(minor)


def torch_builds(entries: Sequence[schema.IndexEntry], cpu: str | None) -> dict[str, dict[int, set[bool]]]:
    """torch minor -> CUDA major -> the C++ ABIs of the aten bindings built for it, from the wheels of
    `cpu` (None: every CPU's): the builds some kernel wheel serves. The per-variant wheels say which
    (torch, CUDA) pairs exist (matrix.yaml builds no wheel for a pair PyTorch never published); the
    all-wheel pairs every binding with every kernel set, so it speaks only in an index without them."""
    builds: dict[str, dict[int, set[bool]]] = {}
    kernel_wheels = [e for e in entries if not e.info.universal and (cpu is None or e.info.platform == cpu)]
    per_variant = [e for e in kernel_wheels if not e.info.all_wheel]
    for entry in per_variant or kernel_wheels:
        info = entry.info
        bindings = info.bindings or (
            schema.BindingFile(
                info.binding or "",
                info.torch or "",
                info.cxx11abi,
                info.binding_form or "aten",
                info.torch_tested,
            ),
        )
        majors = [k.cuda_major for k in info.kernel_sets] or [info.cuda_major or 0]
        for b in bindings:
            minors = set(b.torch_tested) | {b.torch} if b.binding_form == "stable" else {b.torch}
            for minor in minors:
                for major in majors:
                    if not major:
                        continue
                    abis = builds.setdefault(minor, {}).setdefault(major, set())
                    if b.binding_form != "stable" and b.cxx11abi is not None:
                        abis.add(b.cxx11abi)
    floor = versions.MIN_TORCH
    if not builds:  # no kernel wheel (the universal wheel alone): torch from fa's floor, CPU or not
        builds[versions.version_text(floor)] = {}
    # Every minor between the lowest and the newest, so that a torch the wheels skip (2.6 beside an
    # all-wheel of 2.5, 2.7 and 2.10+; 2.12 where a stable wheel's tests skipped it) is found on the page
    # and answered: with the CUDA majors of the minor below it, which its wheels would be built for.
    ordered = sorted(builds, key=_minor_key)
    for lower, upper in itertools.pairwise(ordered):
        (major, low), high = _minor_key(lower), _minor_key(upper)[1]
        for skipped in range(low + 1, high if _minor_key(upper)[0] == major else low + 1):
            builds[f"{major}.{skipped}"] = {m: set() for m in builds[lower]}
    lowest = min(builds, key=_minor_key)
    below = f"{floor[0]}.{floor[1] - 1}"  # one minor below fa's floor, with the lowest minor's CUDA majors
    if floor[1] > 0 and _minor_key(below) < _minor_key(lowest):
        builds[below] = {major: set() for major in builds[lowest]}
    return builds


def python_groups(entries: Sequence[schema.IndexEntry], bases: Sequence[Env]) -> dict[str, str]:
    """Python -> its group: Pythons every wheel says the same of (fit.wheel_reasons) on every platform
    (`bases`) share a group, named by its newest member."""
    groups: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for python in PYTHONS:
        said = []
        for base in bases:
            env = dataclasses.replace(base, python=python)
            tags = TagIndex.of(supported_tags(env))
            said.append(tuple(tuple(wheel_reasons(e, env, tags)) for e in entries))
        groups[python] = seen.setdefault(tuple(said), python)
    return groups


# ---------------------------------------------------------------------------------------------------
# Every machine


def _gpu_options(cpu: str) -> list[tuple[Option, Gpu | None]]:
    options: list[tuple[Option, Gpu | None]] = []
    for sm, label, cpus in GPU_FAMILIES:
        if cpu in cpus:
            name = label.split(": ", 1)[1].split(",")[0].split(" (")[0]  # the family's first GPU
            options.append((Option(sm, label), Gpu(name, sm, None)))
    return [*options, (Option(NO_GPU, "no NVIDIA GPU"), None)]


def _abi_options(abis: set[bool]) -> list[bool | None]:
    """The C++ ABIs to ask about: both where this build's wheels differ in it, else the one fit assumes."""
    both: list[bool | None] = [False, True]
    return both if len(abis) > 1 else [None]


@dataclass(frozen=True)
class Platform:
    """An OS and CPU the kernel wheels are built for, as the picker offers it."""

    os: str  # as Env names it: linux, windows
    cpu: str  # x86_64, aarch64

    @property
    def id(self) -> str:
        return f"{self.os}-{self.cpu}"

    @property
    def label(self) -> str:
        return f"{OS_LABELS.get(self.os, self.os)} {self.cpu}{CPU_NOTES.get(self.cpu, '')}"

    def base(self, glibc: str | None) -> Env:
        """A machine of this platform with nothing installed (the default Python)."""
        return Env(self.os, self.cpu, glibc if self.os == "linux" else None, DEFAULT_PYTHON, None, None, ())


def _os_of(platform_tag: str) -> str:
    """The OS a wheel's platform tag is for: win_amd64 -> windows, macosx_* -> darwin, else linux."""
    return (
        "windows"
        if platform_tag.startswith("win")
        else "darwin"
        if platform_tag.startswith("macosx")
        else "linux"
    )


def platforms(entries: Sequence[schema.IndexEntry]) -> list[Platform]:
    """The OS and CPU pairs the kernel wheels are built for, Linux first and x86_64 first (cpus.PLATFORMS)."""
    built = {
        Platform(_os_of(e.platform_tag or ""), e.info.platform)
        for e in entries
        if e.info.platform and not e.info.universal
    }
    order = list(OS_LABELS)
    found = sorted(
        built,
        key=lambda p: (
            order.index(p.os) if p.os in order else 9,
            PLATFORMS.index(p.cpu) if p.cpu in PLATFORMS else 9,
        ),
    )
    # No kernel wheel at all: the universal wheel still answers a Linux x86_64 machine.
    return found or [Platform("linux", X86_64)]


def machines(entries: Sequence[schema.IndexEntry]) -> Iterator[Machine]:
    """Every combination the picker offers, each with the Env `fa doctor --env` would read for it, in the
    order the page offers them (the first of each axis is its default, but for DEFAULTS)."""
    offered = platforms(entries)
    groups = sorted(set(python_groups(entries, _bases(entries, offered)).values()), key=_python_order)
    for platform in offered:
        cpu, os_name = platform.cpu, platform.os
        drivers = driver_options(driver_floors(entries, os_name))
        builds = torch_builds(entries, cpu)  # torch's builds are the CPU's, whichever OS has wheels
        glibcs = glibc_options(entries) if os_name == "linux" else [(Option(NO_GLIBC, ""), None)]
        for glibc_option, glibc in glibcs:
            for minor in sorted(builds, key=_minor_key, reverse=True):
                majors: list[int | None] = [*sorted(builds[minor], reverse=True), None]
                for major in majors:
                    abis = builds[minor].get(major, set()) if major and os_name == "linux" else set()
                    for abi in _abi_options(abis):
                        torch = TorchInfo(minor, None if major is None else f"{major}.x", None, abi)
                        for python in groups:
                            for gpu_option, gpu in _gpu_options(cpu):
                                for driver_option, driver in (
                                    drivers if gpu else [(Option(NO_DRIVER, ""), None)]
                                ):
                                    key = (
                                        platform.id,
                                        glibc_option.id,
                                        minor,
                                        CPU_TORCH if major is None else str(major),
                                        AUTO_ABI if abi is None else str(abi).lower(),
                                        python,
                                        gpu_option.id,
                                        driver_option.id,
                                    )
                                    gpus = () if gpu is None else (gpu,)
                                    env = dataclasses.replace(
                                        platform.base(glibc),
                                        python=python,
                                        torch=torch,
                                        driver=driver,
                                        gpus=gpus,
                                    )
                                    yield Machine(key, env)


def _bases(entries: Sequence[schema.IndexEntry], offered: Sequence[Platform]) -> list[Env]:
    """A machine of each platform and glibc the page offers, with nothing installed."""
    glibcs = [g for _o, g in glibc_options(entries)]
    return [p.base(g) for p in offered for g in (glibcs if p.os == "linux" else [None])]


def _python_order(python: str) -> int:
    """The default Python's group first, then newest first."""
    return -1 if python == DEFAULT_PYTHON else PYTHONS.index(python)


# ---------------------------------------------------------------------------------------------------
# The answers, as the page embeds them


class _Table:
    """Values kept once, named by their place: an answer names its wheel and reasons by index."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._seen: dict[str, int] = {}
        self._named: dict[str, int] = {}

    def add_once(self, name: str, make: Callable[[], Any]) -> int:
        """The place of the item named `name`, made by make() the first time only."""
        if name not in self._named:
            self._named[name] = self.add(make())
        return self._named[name]

    def add(self, item: Any) -> int:
        text = json.dumps(item, sort_keys=True)
        if text not in self._seen:
            self._seen[text] = len(self.items)
            self.items.append(item)
        return self._seen[text]


def _wheel(entry: schema.IndexEntry) -> dict[str, Any]:
    """A chosen wheel as the page shows it, with the pip and uv lines for its index (install_lines)."""
    lines = install_lines.install_lines(entry, BASE_URL)
    return {
        "file": entry.file,
        "name": doctor.wheel_name(entry),
        "size": entry.size,
        "size_text": size_text(entry.size),
        "sha256": entry.sha256,
        "index": lines.index_name,
        "pip": lines.pip,
        "uv": lines.uv,
    }


@dataclass
class Tables:
    """What answers name by index: the chosen wheels, the reasons, and the sentences many answers share."""

    wheels: _Table = dataclasses.field(default_factory=_Table)
    reasons: _Table = dataclasses.field(default_factory=_Table)
    texts: _Table = dataclasses.field(default_factory=_Table)
    answers: _Table = dataclasses.field(default_factory=_Table)

    def reason(self, r: Reason) -> int:
        return self.reasons.add({"code": r.code, "message": r.message, "fix": r.fix})


def answer(
    selection: Selection, dtype: doctor.DtypeAnswer, env: Env, tables: Tables, facts: index_fixes.IndexFacts
) -> dict[str, Any]:
    """What the page shows for one machine and dtype, in `fa doctor`'s words: the verdict, the wheel and
    the lines that install it (`wheel`, an index into `wheels`), what the GPU runs and why this wheel
    (`runtime`, `acts_as`, `why`: indexes into `texts`), and the reasons behind a fallback or a no-fit
    (`because`, indexes into `reasons`, each with its message and a fix read against the whole index)."""
    entry = selection.selected
    found: dict[str, Any] = {"verdict": dtype.verdict}
    if entry is not None:
        found["wheel"] = tables.wheels.add_once(entry.file, lambda: _wheel(entry))
        if entry.info.all_wheel:
            found["acts_as"] = tables.texts.add(doctor.acts_as(entry, env))
        found["runtime"] = tables.texts.add(doctor.runtime_line(dtype.runtime))
    found["because"] = [tables.reason(r) for r in dtype.deciding]
    if selection.why:
        found["why"] = tables.texts.add(doctor.readable_why(selection))
    if selection.warnings:
        warnings = index_fixes.refine_all(selection.warnings, env, entry, facts)
        found["warnings"] = [tables.reason(r) for r in warnings]
    return found


def page_data(entries: Sequence[schema.IndexEntry], request: Request | None = None) -> dict[str, Any]:
    """Every machine the picker offers and its answer, as JSON data: `options` (an id and a label per
    axis value), `tree` (axis by axis, AXES' order, down to the index of an answer in `answers`),
    `pythons` (each Python's group, the key the tree uses), and the `wheels`, `reasons` and `texts` the
    answers name by index."""
    entries = tuple(entries)
    request = request or Request()
    memo = Memo()
    tree: dict[str, Any] = {}
    tables = Tables()
    facts = index_fixes.IndexFacts.of(entries)
    for machine in machines(entries):
        selection = select(entries, machine.env, request, memo)
        dtypes = doctor.by_dtype(entries, machine.env, selection, request, DTYPES, facts, memo)
        by_name = {a.dtype: a for a in dtypes}
        node = tree
        for part in machine.key[:-1]:
            node = node.setdefault(part, {})
        # The leaf: an answer per dtype, in DTYPES' order.
        node[machine.key[-1]] = [
            tables.answers.add(answer(selection, by_name[d], machine.env, tables, facts)) for d in DTYPES
        ]
    offered = platforms(entries)
    groups = python_groups(entries, _bases(entries, offered))
    return {
        "axes": list(AXES),
        "options": _options(entries, offered),
        # Each OS numbers its drivers and floors its own way: a range's label per platform.
        "driver_labels": {
            p.id: {o.id: o.label for o, _d in driver_options(driver_floors(entries, p.os))} for p in offered
        },
        "pythons": [{"id": p, "group": groups[p]} for p in sorted(PYTHONS, key=_python_order)],
        "tree": tree,
        "answers": tables.answers.items,
        "wheels": tables.wheels.items,
        "reasons": tables.reasons.items,
        "texts": tables.texts.items,
        "verdicts": dict(doctor.VERDICT_TEXT),
        "tell": TELL,
        "base_url": BASE_URL,
        "dtypes": list(DTYPES),
        "defaults": DEFAULTS,
        "assumes": {"request": dataclasses.asdict(request)},
    }


def _options(
    entries: Sequence[schema.IndexEntry], offered: Sequence[Platform]
) -> dict[str, list[dict[str, str]]]:
    def listed(options: Sequence[Option]) -> list[dict[str, str]]:
        return [{"id": o.id, "label": o.label} for o in options]

    builds = torch_builds(entries, None)
    lowest = min(builds, key=_minor_key)
    floor = versions.version_text(versions.MIN_TORCH)
    torch = [Option(m, m + (" or older" if _minor_key(m) < _minor_key(floor) else "")) for m in builds]
    torch.sort(key=lambda o: _minor_key(o.id), reverse=True)
    del lowest
    majors = sorted({m for b in builds.values() for m in b}, reverse=True)
    cuda = [Option(str(m), f"CUDA {m}.x") for m in majors]
    cuda.append(Option(CPU_TORCH, "CPU only (None)"))
    abi = [
        Option("false", "False (PyPI, before torch 2.7)"),
        Option("true", "True (NGC, some pytorch.org builds)"),
        Option(AUTO_ABI, "as torch's build implies"),
    ]
    gpus = {o.id: o for p in offered for o, _gpu in _gpu_options(p.cpu)}
    order = [sm for sm, _label, _cpus in GPU_FAMILIES] + [NO_GPU]
    gpus = {sm: gpus[sm] for sm in order if sm in gpus}
    floors = {f for p in offered for f in driver_floors(entries, p.os)}
    drivers = [o for o, _d in driver_options(sorted(floors, key=versions.parse_driver))]
    return {
        "platform": listed([Option(p.id, p.label) for p in offered]),
        "glibc": listed([*(o for o, _g in glibc_options(entries)), Option(NO_GLIBC, "not Linux")]),
        "torch": listed(torch),
        "cuda": listed(cuda),
        "abi": listed(abi),
        "python": listed([Option(p, p + (" (free-threaded)" if p.endswith("t") else "")) for p in PYTHONS]),
        "gpu": listed(list(gpus.values())),
        "driver": listed([*drivers, Option(NO_DRIVER, "no driver")]),
    }


def option_key(env: Env, data: dict[str, Any]) -> tuple[str, ...]:
    """The options a person with machine `env` picks on the page made of `data` (page_data): torch's
    minor ("or older" below the oldest offered), CUDA major and C++ ABI, the GPU's family (the nearest
    offered compute capability at or below its own, else the oldest) and the driver's range (the newest
    floor at or below it). KeyError: the page offers no such machine (another OS, a newer torch)."""
    torch = env.torch
    minor = versions.torch_minor(torch.version) if torch else ""
    platform = Platform(env.os, canonical(env.arch) or env.arch).id
    glibcs = data["tree"][platform]
    glibc = NO_GLIBC
    if env.os == "linux":
        have = versions.torch_version(env.glibc or "0.0")  # "2.31" reads as (2, 31) like a torch minor
        offered = sorted((g for g in glibcs if g != "any"), key=versions.torch_version)
        at_or_below = [g for g in offered if versions.torch_version(g) <= have]
        glibc = "any" if "any" in glibcs else (at_or_below[-1] if at_or_below else offered[0])
    minors = glibcs[glibc]
    oldest = min(minors, key=_minor_key)
    if minor not in minors and minor and _minor_key(minor) < _minor_key(oldest):
        minor = oldest  # "2.3 or older"
    cuda = str(torch.cuda_major) if torch and torch.cuda_major else CPU_TORCH
    abis = list(minors[minor][cuda])
    abi = AUTO_ABI if abis == [AUTO_ABI] else str(torch.cxx11abi if torch else None).lower()
    python = {p["id"]: p["group"] for p in data["pythons"]}[env.python]
    gpus = minors[minor][cuda][abi][python]
    gpu, driver = NO_GPU, NO_DRIVER
    if env.gpus:
        sm = versions.parse_arch(env.gpus[0].sm)
        families = sorted((g for g in gpus if g != NO_GPU), key=versions.parse_arch)
        below = [g for g in families if versions.parse_arch(g) <= sm]
        gpu = below[-1] if below else families[0]
    if env.driver and env.gpus:
        floors = sorted(gpus[gpu], key=versions.parse_driver)
        driver = max(
            (d for d in floors if versions.driver_at_least(env.driver, d)),
            default=floors[0],
            key=versions.parse_driver,
        )
    return (platform, glibc, minor, cuda, abi, python, gpu, driver)
