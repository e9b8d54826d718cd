"""matrix.yaml: the release matrix, parsed and validated into a `Matrix` before any work starts.

Validation here needs no network: it checks the shape, the spelling of every version and that each
CUDA major can target the archs asked of it. Whether PyPI published a torch minor is checked by the
plan (buildtool/builder/plan.py), which has the torch catalog. Every error names the field as it is written
in the file (`archs."12"[3]`, `exclude[0].torch`) and says how to fix it.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from buildtool.core import binding_forms, cpus, cuda_facts, kernels_src, textfile
from buildtool.core.runtime import schema, versions
from buildtool.core.textfile import shown
from buildtool.errors import InputError

DEFAULT_VERSION = kernels_src.runtime_module("_version").__version__  # fa's version, one source
MIN_TORCH = versions.version_text(versions.MIN_TORCH)  # "2.4": the runtime's floor, and the C shim's
# From 2.7 every pip wheel of torch uses the C++11 ABI; before, PyPI used the old one while NGC and
# some PyTorch-index builds (2.6.0+cu126) used the new one (PyTorch 2.7 release notes).
CXX11ABI_ONLY_FROM = "2.7"
CXX11ABI_POLICIES = ("auto", "true", "false", "both")
DTYPES = ("fp16", "bf16")
DIRECTIONS = (
    schema.DIRECTIONS
)  # fwd, bwd, splitkv: the units' directions (kernels/tiles.py), as manifests name them

KNOWN_KEYS = (
    "version",
    "torch",
    "cuda",
    "python",
    "platforms",
    "archs",
    "ptx",
    "exclude",
    "cxx11abi",
    "stable_abi",
    "kernels",
    "all_wheel",
    "sass_per_major",
)
EXCLUDE_KEYS = ("torch", "cuda", "python", "platform")
KERNEL_FILTER_KEYS = ("dtypes", "head_dims", "directions")

# ASCII digits only, and lengths far above any real value: str.isdigit() and \\d accept other
# scripts' digits, which Version() and int() then refuse or misread.
_MINOR = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})", re.ASCII)
_PYTHON = re.compile(r"3\.([0-9]{1,3})(t?)", re.ASCII)
_MAJOR = re.compile(r"[0-9]{1,3}", re.ASCII)
_T = TypeVar("_T")  # what a list parser makes of each item
_MAX_VERSION = 64  # characters of a version or specifier


class MatrixError(InputError):
    """A value in matrix.yaml (or on the command line) that fa cannot work with."""


def default_ptx(archs: tuple[str, ...]) -> str | None:
    """The PTX a major ships when matrix.yaml names none: its newest plain arch's (None if it has none)."""
    plain = cuda_facts.plain(archs)
    return plain[-1] if plain else None


def arch_option(arch: str, source: str) -> tuple[int, int]:
    """The compute capability `--arch` names ("8.6" -> (8, 6)); MatrixError naming the option else."""
    try:
        return versions.parse_arch(arch)
    except ValueError:
        raise MatrixError(
            source, "--arch", f"{arch!r} is not a compute capability", 'write it like "8.6"'
        ) from None


@dataclass(frozen=True)
class KernelFilter:
    """Optional `kernels:` key: build only some kernel units (quick dev builds and tests).
    None in a field means no filter on it."""

    dtypes: tuple[str, ...] | None = None
    head_dims: tuple[int, ...] | None = None
    directions: tuple[str, ...] | None = None

    def accepts(self, unit: Any) -> bool:
        """True if this tiles.KernelUnit is selected."""
        return (
            (self.dtypes is None or unit.dtype in self.dtypes)
            and (self.head_dims is None or unit.head_dim in self.head_dims)
            and (self.directions is None or unit.direction in self.directions)
        )


@dataclass(frozen=True)
class Matrix:
    version: str  # package version, without a local label (the plan adds the variant)
    torch: tuple[str, ...]  # minors, "2.5"
    cuda: tuple[int, ...]  # majors
    python: tuple[str, ...]  # "3.12", "3.13t" (free-threaded)
    archs: dict[int, tuple[str, ...]]  # SASS per CUDA major, sorted
    ptx: dict[int, str | None]  # per major: the arch whose PTX is shipped, None for none
    exclude: tuple[dict[str, Any], ...] = ()  # as written (values may be PEP 440 specifiers like ">=2.8")
    cxx11abi: str = "auto"  # one of CXX11ABI_POLICIES
    kernels: KernelFilter | None = None
    platforms: tuple[str, ...] = cpus.DEFAULT_PLATFORMS  # CPUs to build bindings for
    # The floor of the stable-ABI binding: the minors from it on share one wheel per (CPU, CUDA major)
    # whose binding is built against the floor's headers; None: a binding per minor throughout.
    stable_abi: str | None = None
    # One more wheel per CPU, variant "all": every binding and CUDA major of that CPU's wheels in one
    # (buildtool/builder/all_wheel.py), for PyPI.
    all_wheel: bool = False
    # CUDA majors whose wheels compile every arch's SASS with their own NVRTC; by default CUDA 12's and
    # 13's wheels ship the oldest major's cubin whose NVRTC targets the arch with the same program
    # (wheel_specs.sass_compiler: 13 -> 12 -> 11).
    sass_per_major: tuple[int, ...] = ()
    source: str = field(default="matrix.yaml", compare=False)

    def stable(self, torch_minor: str) -> bool:
        """True when the stable-ABI wheel serves this torch minor (it is at or above the floor)."""
        return self.stable_abi is not None and Version(torch_minor) >= Version(self.stable_abi)

    def abis(self, torch_minor: str) -> tuple[bool, ...]:
        """The C++ ABIs to build a binding for, for this torch minor (False first)."""
        if self.cxx11abi == "true":
            return (True,)
        if self.cxx11abi == "false":
            return (False,)
        if self.cxx11abi == "both":
            return (False, True)
        return (True,) if Version(torch_minor) >= Version(CXX11ABI_ONLY_FROM) else (False, True)

    def excluded_by(self, torch: str, cuda: int, python: str, platform: str = cpus.X86_64) -> int | None:
        """Index of the first `exclude` entry matching this cell, None if no entry does."""
        for i, entry in enumerate(self.exclude):
            if all(
                _exclude_value_matches(key, value, torch, cuda, python, platform)
                for key, value in entry.items()
            ):
                return i
        return None


def python_version(python: str) -> tuple[Version, bool]:
    """ "3.13t" -> (Version("3.13"), True)."""
    free_threaded = python.endswith("t")
    return Version(python.removesuffix("t")), free_threaded


def load_matrix(path: Path, tiles: ModuleType | None = None) -> Matrix:
    try:
        text = textfile.read_text(path, fix="pass the path of a matrix.yaml")
    except textfile.TextFileError as e:
        raise MatrixError(str(path), "(file)", e.problem, e.fix) from None
    return parse_matrix(text, str(path), tiles=tiles)


class _DuplicateKey(Exception):
    def __init__(self, key: object, first: int, second: int) -> None:
        self.key, self.first, self.second = key, first, second


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise _DuplicateKey(key, seen[key] + 1, key_node.start_mark.line + 1)
                seen[key] = key_node.start_mark.line
            except TypeError:
                pass  # an unhashable key: the base class says so with its line
        return super().construct_mapping(node, deep=deep)


def parse_matrix(text: str, source: str, tiles: ModuleType | None = None) -> Matrix:
    """Parse and validate matrix.yaml text. `tiles` (kernels/tiles.py) is loaded when needed; tests
    pass a small fake."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no Python objects
    except _DuplicateKey as e:
        raise MatrixError(
            source,
            _key_name(e.key),
            f"given twice (lines {e.first} and {e.second}); YAML would keep the last silently",
            "keep one of them",
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise MatrixError(
            source, "(syntax)", f"not valid YAML{where}: {shown(problem)}", "fix the YAML syntax"
        ) from None
    except (ValueError, RecursionError) as e:  # an int past int()'s digit limit; nesting past the stack
        problem = "nested too deeply" if isinstance(e, RecursionError) else "a number too long to read"
        raise MatrixError(source, "(syntax)", f"not YAML fa can read ({problem})", "fix the YAML") from None
    return _Parser(source, tiles).matrix(data)


class _Parser:
    def __init__(self, source: str, tiles: ModuleType | None) -> None:
        self.source = source
        self._tiles = tiles

    def tiles(self) -> ModuleType:
        if self._tiles is None:
            self._tiles = kernels_src.tiles()
        return self._tiles

    def error(self, field_: str, message: str, fix: str) -> MatrixError:
        return MatrixError(self.source, field_, message, fix)

    def matrix(self, data: object) -> Matrix:
        if not isinstance(data, dict):
            raise self.error(
                "(top level)",
                f"expected a mapping of keys, got {_kind(data)}",
                'start from the matrix.yaml in the fa repository: torch: ["2.5"], cuda: [12], python: ["3.12"]',
            )
        for key in data:
            if key not in KNOWN_KEYS:
                raise self.error(_key_name(key), "unknown key", _unknown_key_fix(str(key)[:40], KNOWN_KEYS))
        for key in ("torch", "cuda", "python"):
            if key not in data:
                raise self.error(key, "missing", f"add {key}: {_EXAMPLES[key]}")
        torch = self._unique_list("torch", data["torch"], self.torch_minor)
        cuda = self._unique_list("cuda", data["cuda"], self.cuda_major)
        python = self._unique_list("python", data["python"], self.python_version)
        plats: tuple[str, ...] = cpus.DEFAULT_PLATFORMS
        if data.get("platforms") is not None:
            plats = self._unique_list("platforms", data["platforms"], self.platform)
        archs = self.archs(data.get("archs"), cuda)
        return Matrix(
            version=self.version(data.get("version", DEFAULT_VERSION)),
            torch=torch,
            cuda=cuda,
            python=python,
            archs=archs,
            ptx=self.ptx(data.get("ptx"), cuda, archs),
            exclude=self.exclude(
                data.get("exclude"), {"torch": torch, "cuda": cuda, "python": python, "platform": plats}
            ),
            cxx11abi=self.cxx11abi(data.get("cxx11abi", "auto")),
            kernels=self.kernels(data.get("kernels")),
            platforms=plats,
            stable_abi=self.stable_abi(data.get("stable_abi"), torch),
            all_wheel=self.all_wheel(data.get("all_wheel", False)),
            sass_per_major=self.sass_per_major(data.get("sass_per_major"), cuda),
            source=self.source,
        )

    # -- scalar keys ---------------------------------------------------------------------------

    def version(self, value: object) -> str:
        if not isinstance(value, str):
            raise self.error("version", f"{shown(value)} is not a string", 'quote it: version: "1.0.0"')
        try:
            if len(value) > _MAX_VERSION:
                raise InvalidVersion(value)
            v = Version(value)
        except (InvalidVersion, ValueError):  # ValueError: a number past int()'s digit limit
            raise self.error(
                "version", f"{shown(value)} is not a PEP 440 version", 'write it like "1.0.0" or "1.0.0rc1"'
            ) from None
        if v.local is not None:
            raise self.error(
                "version",
                f"{shown(value)} has a local label (+{v.local})",
                f'write "{v.public}": fa adds the variant label (+cu12torch2.5) itself',
            )
        return value

    def cxx11abi(self, value: object) -> str:
        # YAML reads true/false as booleans; both spellings mean the same policy.
        text = str(value).lower() if isinstance(value, bool | str) else None
        if text not in CXX11ABI_POLICIES:
            raise self.error(
                "cxx11abi",
                f"{shown(value)} is not a C++ ABI policy",
                "write one of: auto (both ABIs below torch 2.7, the C++11 ABI from 2.7), true, false, both",
            )
        return text

    def all_wheel(self, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.error("all_wheel", f"{shown(value)} is not true or false", "write all_wheel: true")
        return value

    def sass_per_major(self, value: object, cuda: tuple[int, ...]) -> tuple[int, ...]:
        if value is None or value == []:
            return ()
        majors = self._unique_list("sass_per_major", value, self.cuda_major)
        for i, major in enumerate(majors):
            if major not in cuda:
                raise self.error(
                    f"sass_per_major[{i}]",
                    f"CUDA {major} is not in cuda ({', '.join(map(str, cuda))})",
                    f"remove it, or add {major} to cuda",
                )
            if major not in cuda_facts.SASS_FROM:
                raise self.error(
                    f"sass_per_major[{i}]",
                    f"CUDA {major}'s wheels compile all their SASS with their own NVRTC already",
                    f"remove it (only {', '.join(map(str, cuda_facts.SASS_FROM))} can take another major's)",
                )
        return majors

    def stable_abi(self, value: object, torch: tuple[str, ...]) -> str | None:
        if value is None:
            return None
        floor = self.torch_minor("stable_abi", value)
        if Version(floor) < Version(binding_forms.STABLE_ABI_MIN):
            raise self.error(
                "stable_abi",
                f"the stable-ABI binding needs torch {binding_forms.STABLE_ABI_MIN} or newer (its op "
                f"arguments str and int[] exist in torch's stable ABI from {binding_forms.STABLE_ABI_MIN})",
                f'write stable_abi: "{binding_forms.STABLE_ABI_MIN}" or a later listed minor, or remove the key',
            )
        if floor not in torch:
            raise self.error(
                "stable_abi",
                f"torch {floor} is not in torch ({_join(torch)}); the floor is the oldest minor the "
                "stable-ABI wheel serves, and it is tested with it",
                f'add "{floor}" to torch, or name a listed minor',
            )
        return floor

    # -- lists -----------------------------------------------------------------------------------

    def _unique_list(
        self, key: str, value: object, parse_item: Callable[[str, object], _T]
    ) -> tuple[_T, ...]:
        """A top-level list: non-empty, each item parsed by `parse_item(field, item)`, none twice."""
        if not isinstance(value, list) or not value:
            raise self.error(
                key, f"expected a non-empty list, got {_kind(value)}", f"write {key}: {_EXAMPLES[key]}"
            )
        out = [parse_item(f"{key}[{i}]", item) for i, item in enumerate(value)]
        self._no_duplicates(key, out)
        return tuple(out)

    def _no_duplicates(self, key: str, items: list[Any]) -> None:
        seen: dict[object, int] = {}
        for i, item in enumerate(items):
            if item in seen:
                raise self.error(
                    f"{key}[{i}]",
                    f"{shown(item)} is listed twice (also {key}[{seen[item]}])",
                    "remove one of them",
                )
            seen[item] = i

    def torch_minor(self, field_: str, item: object) -> str:
        if isinstance(item, float | int) and not isinstance(item, bool):
            raise self.error(
                field_,
                f"{shown(item)} is a number, and YAML reads 2.10 as 2.1",
                f'quote the minor: "{shown(item)}"',
            )
        if not isinstance(item, str) or not _MINOR.fullmatch(item):
            hint = ""
            if isinstance(item, str) and re.match(r"^\d+\.\d+\.\d+", item):
                hint = f' (the plan builds against the oldest patch of each minor itself: write "{".".join(item.split(".")[:2])}")'
            raise self.error(
                field_, f"{shown(item)} is not a torch minor{hint}", 'write major.minor in quotes, like "2.5"'
            )
        if Version(item) < Version(MIN_TORCH):
            raise self.error(
                field_,
                f"torch {item} is older than fa supports ({MIN_TORCH}: the binding needs torch's C shim)",
                f'remove it, or raise it to "{MIN_TORCH}"',
            )
        return item

    def cuda_major(self, field_: str, item: object) -> int:
        known = ", ".join(str(m) for m in cuda_facts.TOOLKITS)
        if isinstance(item, float) or (isinstance(item, str) and re.match(r"^\d+\.\d+", item)):
            major = str(item).split(".")[0]
            raise self.error(
                field_,
                f"{shown(item)} is a CUDA version; the matrix lists CUDA majors (one pinned toolkit each)",
                f"write the major only: {major}",
            )
        if isinstance(item, str) and _MAJOR.fullmatch(item):
            item = int(item)
        if not isinstance(item, int) or isinstance(item, bool):
            raise self.error(field_, f"{shown(item)} is not a CUDA major", f"write a number, one of {known}")
        if item not in cuda_facts.TOOLKITS:
            raise self.error(
                field_,
                f"CUDA {item} has no pinned toolkit in fa (buildtool/core/cuda_facts.py)",
                f"use one of {known}",
            )
        return item

    def python_version(self, field_: str, item: object) -> str:
        if isinstance(item, float | int) and not isinstance(item, bool):
            raise self.error(
                field_,
                f"{shown(item)} is a number, and YAML reads 3.10 as 3.1",
                f'quote the version: "{shown(item)}"',
            )
        m = _PYTHON.fullmatch(item) if isinstance(item, str) else None
        if m is None or not isinstance(item, str):  # (the second test narrows the type for checkers)
            hint = ""
            if isinstance(item, str) and re.match(r"^3\.\d+\.\d+", item):
                hint = f'; write the minor only: "{".".join(item.split(".")[:2])}"'
            raise self.error(
                field_,
                f"{shown(item)} is not a Python minor",
                f'write it like "3.12", or "3.13t" for free-threaded CPython{hint}',
            )
        if m.group(2) and int(m.group(1)) < 13:
            raise self.error(
                field_,
                f"{shown(item)}: free-threaded CPython exists from 3.13",
                f'write "3.{m.group(1)}", or a free-threaded 3.13t or newer',
            )
        return item

    def platform(self, field_: str, item: object) -> str:
        known = ", ".join(cpus.PLATFORMS)
        if not isinstance(item, str):
            raise self.error(field_, f"{shown(item)} is not a CPU architecture", f"write one of {known}")
        name = cpus.canonical(item)
        if name is None:
            raise self.error(
                field_,
                f"fa builds no wheels for {shown(item)} (Linux only, and torch's CUDA builds exist for {known})",
                f"write one of {known}",
            )
        if name != item:
            raise self.error(
                field_, f"{shown(item)} is spelled {shown(name)} in wheel tags", f'write "{name}"'
            )
        return name

    # -- per CUDA major ----------------------------------------------------------------------------

    def _major_key(self, field_: str, key: object, cuda: tuple[int, ...]) -> int:
        major = int(key) if isinstance(key, str) and _MAJOR.fullmatch(key) else None
        if isinstance(key, int) and not isinstance(key, bool) and 0 <= key < 1000:
            major = key
        if major is None:
            raise self.error(
                f"{field_}.{shown(key)}", "keys are CUDA majors", f'write {field_}: {{"12": [...]}}'
            )
        if major not in cuda:
            raise self.error(
                f'{field_}."{major}"',
                f"CUDA {major} is not in cuda ({list(cuda)})",
                f"add {major} to cuda, or remove this entry",
            )
        return major

    def arch(self, field_: str, item: object, major: int) -> str:
        tk = cuda_facts.TOOLKITS[major]
        if isinstance(item, float | int) and not isinstance(item, bool):
            raise self.error(field_, f"{shown(item)} is a number", f'quote the arch: "{shown(item)}"')
        if not isinstance(item, str):
            raise self.error(field_, f"{shown(item)} is not an arch", 'write a compute capability like "8.6"')
        try:
            major_minor = versions.parse_target(item)
        except ValueError:
            digits = re.sub(r"^sm_?", "", item)
            hint = (
                f' (write "{digits[:-1]}.{digits[-1]}")'
                if re.fullmatch(r"[0-9]{2,3}", digits, re.ASCII)
                else ""
            )
            raise self.error(
                field_,
                f"{shown(item)} is not a compute capability{hint}",
                'write it like "8.6" (sm_86 is "8.6")',
            ) from None
        cap = major_minor[:2]
        min_arch = self.tiles().MIN_ARCH
        if cap < versions.parse_arch(min_arch):
            raise self.error(
                field_,
                f"arch {item} is below what fa's kernels support ({min_arch})",
                "remove it (those GPUs fall back to PyTorch's attention)",
            )
        if item not in tk.archs:
            others = [m for m, t in cuda_facts.TOOLKITS.items() if item in t.archs]
            where = f"build it with CUDA {', '.join(map(str, others))}" if others else "use an arch fa knows"
            raise self.error(
                field_,
                f"arch {item} cannot be targeted by CUDA {major} "
                f"(NVRTC {tk.version} targets {', '.join(tk.archs)})",
                f"remove it, or {where}",
            )
        return item

    def archs(self, value: object, cuda: tuple[int, ...]) -> dict[int, tuple[str, ...]]:
        archs = {m: cuda_facts.TOOLKITS[m].default_archs for m in cuda}
        if value is None:
            return archs
        if not isinstance(value, dict):
            raise self.error(
                "archs", f"expected a mapping, got {_kind(value)}", 'write archs: {"12": ["8.0", "9.0"]}'
            )
        for key, items in value.items():
            major = self._major_key("archs", key, cuda)
            field_ = f'archs."{major}"'
            if not isinstance(items, list) or not items:
                raise self.error(
                    field_, f"expected a non-empty list of archs, got {_kind(items)}", 'write ["8.0", "9.0"]'
                )
            out = [self.arch(f"{field_}[{i}]", item, major) for i, item in enumerate(items)]
            self._no_duplicates(field_, out)
            archs[major] = tuple(sorted(out, key=versions.parse_target))
        return archs

    def ptx(
        self, value: object, cuda: tuple[int, ...], archs: dict[int, tuple[str, ...]]
    ) -> dict[int, str | None]:
        # Default: PTX of the newest SASS arch, so GPUs newer than the wheel still get a kernel (JIT); never
        # of an arch-specific target ("9.0a"), whose PTX JITs on its own compute capability only.
        ptx: dict[int, str | None] = {m: default_ptx(archs[m]) for m in cuda}
        if value is None:
            return ptx
        if not isinstance(value, dict):
            raise self.error(
                "ptx", f"expected a mapping, got {_kind(value)}", 'write ptx: {"12": "12.0"} (null: none)'
            )
        for key, item in value.items():
            major = self._major_key("ptx", key, cuda)
            field_ = f'ptx."{major}"'
            ptx[major] = None if item is None else self.arch(field_, item, major)
            if ptx[major] is not None and versions.arch_specific(str(ptx[major])):
                raise self.error(
                    field_,
                    f"{shown(item)} is arch-specific: its PTX would JIT on compute capability "
                    f"{versions.target_arch(str(item))} only, where its SASS runs already",
                    f'name a plain arch ("{versions.target_arch(str(item))}") or null for no PTX',
                )
        return ptx

    def exclude(self, value: object, listed: dict[str, tuple[Any, ...]]) -> tuple[dict[str, Any], ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.error(
                "exclude", f"expected a list, got {_kind(value)}", 'write exclude: [{torch: "2.4", cuda: 13}]'
            )
        out = []
        for i, entry in enumerate(value):
            field_ = f"exclude[{i}]"
            if not isinstance(entry, dict) or not entry:
                raise self.error(
                    field_,
                    f"expected a non-empty mapping, got {_kind(entry)}",
                    'write {torch: "2.4", cuda: 13}; values may be specifiers like ">=2.8"',
                )
            for key, item in entry.items():
                if key not in EXCLUDE_KEYS:
                    raise self.error(
                        f"{field_}.{_key_name(key)}",
                        "unknown key",
                        _unknown_key_fix(str(key)[:40], EXCLUDE_KEYS),
                    )
                self.exclude_value(f"{field_}.{key}", key, item, listed[key])
            out.append(dict(entry))
        return tuple(out)

    def exclude_value(self, field_: str, key: str, item: object, listed: tuple[Any, ...]) -> None:
        """An exact value (validated like the list it filters) or a PEP 440 specifier string."""
        if key == "platform" and isinstance(item, str) and item[:1] in "<>=!~":
            raise self.error(
                field_, f"{shown(item)}: a platform is a name, not a version", "write x86_64 or aarch64"
            )
        if isinstance(item, str) and item[:1] in "<>=!~":
            try:
                if len(item) > _MAX_VERSION:
                    raise InvalidSpecifier(item)
                # contains() parses the versions in it: one past int()'s digit limit raises ValueError
                SpecifierSet(item).contains(Version("1.0"), prereleases=True)
            except (InvalidSpecifier, ValueError):
                raise self.error(
                    field_,
                    f"{shown(item)} is not a PEP 440 specifier",
                    'write it like ">=2.8" or ">=2.4,<2.7"',
                ) from None
            return
        if key == "platform":
            exact: object = self.platform(field_, item)
        elif key == "torch":
            exact = self.torch_minor(field_, item)
        elif key == "cuda":
            exact = self.cuda_major(field_, item)
        else:
            exact = self.python_version(field_, item)
        # An exact value that is not in the matrix is almost always a typo, and it excludes nothing.
        if exact not in listed:
            raise self.error(
                field_,
                f"{shown(item)} is not in {key} ({_join(listed)}), so this entry excludes nothing",
                "fix the value, or remove the entry",
            )

    def kernels(self, value: object) -> KernelFilter | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.error(
                "kernels",
                f"expected a mapping, got {_kind(value)}",
                'write kernels: {dtypes: ["bf16"], head_dims: [128]}',
            )
        for key in value:
            if key not in KERNEL_FILTER_KEYS:
                raise self.error(
                    f"kernels.{_key_name(key)}",
                    "unknown key",
                    _unknown_key_fix(str(key)[:40], KERNEL_FILTER_KEYS),
                )
        dtypes = self._choices("kernels.dtypes", value.get("dtypes"), DTYPES)
        directions = self._choices("kernels.directions", value.get("directions"), DIRECTIONS)
        head_dims = None
        if value.get("head_dims") is not None:
            buckets = tuple(self.tiles().HEAD_DIM_BUCKETS)
            head_dims = self._choices("kernels.head_dims", value["head_dims"], buckets)
        return KernelFilter(dtypes=dtypes, head_dims=head_dims, directions=directions)

    def _choices(self, field_: str, value: object, allowed: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if value is None:
            return None
        if not isinstance(value, list) or not value:
            raise self.error(
                field_, f"expected a non-empty list, got {_kind(value)}", f"write a list of: {_join(allowed)}"
            )
        for i, item in enumerate(value):
            if item not in allowed:
                raise self.error(
                    f"{field_}[{i}]", f"{shown(item)} is not one of {_join(allowed)}", "use one of those"
                )
        self._no_duplicates(field_, value)
        return tuple(value)


_EXAMPLES = {
    "torch": '["2.5", "2.6"]',
    "cuda": "[12, 13]",
    "python": '["3.11", "3.12", "3.13t"]',
    "platforms": '["x86_64", "aarch64"]',
    "sass_per_major": "[13]",
}


def _exclude_value_matches(
    key: str, value: object, torch: str, cuda: int, python: str, platform: str
) -> bool:
    if key == "platform":
        return value == platform
    if key == "torch":
        return _matches(value, torch, Version(torch))
    if key == "cuda":
        return _matches(value, str(cuda), Version(str(cuda)))
    # A specifier on python compares the version alone, so ">=3.14" excludes 3.14 and 3.14t; an exact
    # "3.13t" names only the free-threaded build.
    return _matches(value, python, python_version(python)[0])


def _matches(value: object, exact: str, version: Version) -> bool:
    if isinstance(value, str) and value[:1] in "<>=!~":
        return _specifier(value).contains(version, prereleases=True)
    return str(value) == exact


@functools.lru_cache(maxsize=256)
def _specifier(text: str) -> SpecifierSet:
    """An exclude entry's specifier, parsed once: a plan matches every cell against every entry."""
    return SpecifierSet(text)


def _unknown_key_fix(key: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f'did you mean "{close[0]}"? ' if close else ""
    return f"{hint}known keys: {', '.join(known)}"


def _join(items: tuple[Any, ...]) -> str:
    return ", ".join(str(i) for i in items)


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, list) and not value:
        return "an empty list"
    return f"{type(value).__name__} {shown(value)}"


def _key_name(key: object) -> str:
    """A mapping key as a field name in a message: as written when it is a short name, else shown."""
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", key, re.ASCII):
        return key
    return shown(key)
