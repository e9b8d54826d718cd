"""What a wheel says about itself: fa_attn/manifest.json inside every wheel, and the entries of
wheels/index.json that repeat it (docs/contracts.md sections 3 and 5). One typed definition, from which
the build writes both (buildtool/builder/package.py, buildtool/builder/index.py) and the runtime
(loader.py), `fa doctor` and `fa install` (buildtool/compat/wheel_index.py) read them.

Stdlib only: it ships in every wheel, and buildtool loads this same file by path
(buildtool/core/kernels_src.py) without importing torch.

Versions: both documents carry `"schema": MAJOR` and `"schema_minor": MINOR`. A field added (to a
dataclass below) is a new minor: raise SCHEMA_MINOR, give the field `since=` that minor and an
`absent=` value (what a reader assumes for files written before it), and add it to the minor's list in
tests/runtime/test_schema.py and to docs/contracts.md. Readers refuse another major (`SchemaError`)
and read every minor: keys they do not know are ignored, keys a file lacks take their `absent` value
(a field without one is required). Removing or retyping a field is a new major.
"""

from __future__ import annotations

import dataclasses
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .versions import parse_arch, parse_driver, target_name

SCHEMA_MAJOR = 1
# 0: the first published shape. 1: coverage rows per compiled program with its `smem_bytes`; index
# entries repeat the manifest's `binding` and `features`. 2: `binding_form` (aten | stable) and
# `torch_tested`, for the stable-ABI wheels that serve every torch from their floor on; the manifest's
# `source_sha256`. 3: the all-wheel (variant "all"): `bindings` and `kernel_sets`, several of each in
# one wheel, and a kernel file's `cuda_major`. 4: arch-specific images (sm_90a): a kernel file's and a
# coverage row's `arch_specific`, and the wheel's and a kernel set's `arch_specific` targets ("9.0a");
# tiles chosen by the GPU's shared memory: a launch's
# `static_smem`, a kernel file's and a coverage row's `tile`, a coverage row's `static_smem`; several
# rows (the default tile and its alternatives) may serve one head dim.
SCHEMA_MINOR = 4

PACKAGE = "fa-attn"  # the distribution
DIST = "fa_attn"  # the import package and the wheel file name's prefix
MANIFEST_PATH = f"{DIST}/manifest.json"  # inside every wheel
MANIFEST_MAX_BYTES = 16 << 20  # an all-wheel's manifest, a few thousand kernel files, is under 2 MB
BINDING_FILE = "libfa_attn_ops.so"  # the host binding, inside fa_attn/

IMAGES = ("sass", "ptx")
DIRECTIONS = ("fwd", "bwd", "splitkv")  # kernels/tiles.py DIRECTIONS
DTYPES = ("fp16", "bf16")  # the kernels' dtypes (fp32 calls fall back)
MAX_HEAD_DIM = 1024  # far above any kernel's (256): a bound for readers, not a kernel limit


class SchemaError(ValueError):
    """A manifest or index entry that does not have the shape below; the message names the field."""


_REQUIRED: Any = object()
T = TypeVar("T")


def _field(read: Callable[[Any, str], Any], *, since: int = 0, absent: Any = _REQUIRED) -> Any:
    """A key of the JSON: how to read it, the minor that added it, its value when a file lacks it."""
    return dataclasses.field(metadata={"read": read, "since": since, "absent": absent})


def _flat() -> Any:
    """A WheelInfo whose keys sit in the enclosing JSON object (a manifest, an index entry)."""
    return dataclasses.field(metadata={"flat": True})


# ---- readers of one JSON value: (value, where) -> typed value, or SchemaError naming `where` ------------


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4
_REPR.maxlevel = 2
_REPR.maxlong = 40
MAX_SHOWN = 80


def shown(value: Any) -> str:
    """What a message may quote of a value from a file: one short printable line, however large or
    strange the value (a whole nested value, or a control character, never reaches a terminal)."""
    try:
        text = _REPR.repr(value)
    except (ValueError, RecursionError):  # an int past Python's 4300-digit conversion limit
        text = f"<{type(value).__name__} too large to show>"
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _fail(where: str, value: Any, wanted: str) -> SchemaError:
    return SchemaError(f"{where}: got {shown(value)}; expected {wanted}")


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(where, value, "a string")
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):  # a bool is an int to Python, not here
        raise _fail(where, value, "an integer")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, value, "true or false")
    return value


def _optional(read: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    def optional(value: Any, where: str) -> T | None:
        return None if value is None else read(value, where)

    return optional


def _tuple_of(read: Callable[[Any, str], T]) -> Callable[[Any, str], tuple[T, ...]]:
    def many(value: Any, where: str) -> tuple[T, ...]:
        if not isinstance(value, (list, tuple)):
            raise _fail(where, value, "a list")
        return tuple(read(item, f"{where}[{i}]") for i, item in enumerate(value))

    return many


def _parsed_by(parse: Callable[[str], object], wanted: str) -> Callable[[Any, str], str]:
    """A string that `parse` (versions.py) accepts, kept as written."""

    def read(value: Any, where: str) -> str:
        text = _str(value, where)
        try:
            parse(text)
        except ValueError:
            raise _fail(where, value, wanted) from None
        return text

    return read


def _matching(pattern: str, wanted: str, normal: Callable[[str], str] = str) -> Callable[[Any, str], str]:
    regex = re.compile(pattern, re.ASCII)

    def read(value: Any, where: str) -> str:
        if not isinstance(value, str) or regex.fullmatch(value) is None:
            raise _fail(where, value, wanted)
        return normal(value)

    return read


def _one_of(*choices: str) -> Callable[[Any, str], str]:
    def read(value: Any, where: str) -> str:
        if value not in choices:
            raise _fail(where, value, " or ".join(choices))
        return str(value)

    return read


def _int_in(low: int, high: int) -> Callable[[Any, str], int]:
    def read(value: Any, where: str) -> int:
        number = _int(value, where)
        if not low <= number <= high:
            raise _fail(where, value, f"an integer from {low} to {high}")
        return number

    return read


# The values fa writes, and the readers that refuse any other: a value outside them is not one fa
# wrote, and would break a comparison later (doctor's, or the runtime's).
_arch = _parsed_by(parse_arch, 'a compute capability like "8.0"')
_specific_target = _matching(r"[0-9]{1,2}\.[0-9]{1,2}a", 'an arch-specific target like "9.0a"')
_driver = _parsed_by(parse_driver, 'a driver version like "575.51.03"')
_torch_minor = _matching(r"[0-9]{1,3}\.[0-9]{1,3}", 'a torch minor like "2.5"')
_sha256 = _matching(r"[0-9a-fA-F]{64}", "64 hex digits", str.lower)  # either case: one hash
_image = _one_of(*IMAGES)
_direction = _one_of(*DIRECTIONS)
_dtype = _one_of(*DTYPES)
_head_dim = _int_in(1, MAX_HEAD_DIM)
_size = _int_in(0, 1 << 40)
_cuda_major = _int_in(1, 99)


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where or "the document", value, "an object")
    return value


def _wheel_file(value: Any, where: str) -> str:
    # A bare file name: readers join it to the index's directory or URL and to a scratch directory.
    name = _str(value, where)
    if "/" in name or "\\" in name or not name.endswith(".whl") or name.startswith("."):
        raise _fail(where, name, "a wheel file name next to index.json")
    return name


_opt_str = _optional(_str)
_opt_int = _optional(_int)
_opt_bool = _optional(_bool)
_strs = _tuple_of(_str)

D = TypeVar("D")


def _read(cls: type[D], data: Any, where: str) -> D:
    """An instance of dataclass `cls` from a JSON object: each field read, absent ones defaulted."""
    data = _object(data, where)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if "flat" in f.metadata:
            values[f.name] = _read(WheelInfo, data, where)
        elif f.name in data:
            values[f.name] = f.metadata["read"](data[f.name], _at(where, f.name))
        elif f.metadata["absent"] is _REQUIRED:
            raise SchemaError(f"{_at(where, f.name)}: missing")
        else:
            values[f.name] = f.metadata["absent"]
    return cls(**values)


def _rows(cls: type[T]) -> Callable[[Any, str], tuple[T, ...]]:
    return _tuple_of(lambda value, where: _read(cls, value, where))


def _json(value: Any) -> Any:
    """A typed value back to JSON: dataclasses to objects in field order (flat ones merged), tuples to
    lists, mappings kept in their order (a kernel's entries are in launch order)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = _json(getattr(value, f.name))
            if "flat" in f.metadata:
                out.update(item)
            else:
                out[f.name] = item
        return out
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value


def schema_minor(data: Mapping[str, Any]) -> int:
    """The minor of a manifest or index.json; SchemaError for another major (another fa wrote it)."""
    major = data.get("schema")
    if isinstance(major, bool) or major != SCHEMA_MAJOR:
        newer = isinstance(major, int) and not isinstance(major, bool) and major > SCHEMA_MAJOR
        fix = "upgrade fa-toolchain (pip install -U fa-toolchain)" if newer else "rebuild it with fa build"
        raise SchemaError(f"schema: got {major!r}; this fa reads schema {SCHEMA_MAJOR}: {fix}")
    return _int(data.get("schema_minor", 0), "schema_minor")


# ---- the parts ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """One __global__ entry point of a kernel file (kernels/tiles.py's Launch, as shipped)."""

    threads: int = _field(_int)
    block_m: int = _field(_int)  # query rows per block (0 if unused)
    block_n: int = _field(_int)  # key rows per block (0 if unused)
    smem_bytes: int = _field(_int)  # dynamic shared memory per block
    grid: str = _field(_str)  # "q_blocks" | "k_blocks" | "q_blocks_splits"
    # Static shared memory the kernel carries besides (tiles.static_smem: a cubin's own figure, which
    # the build checks; PTX's JIT margin). 0 in files before 1.4, which did not count it.
    static_smem: int = dataclasses.field(default=0, metadata={"read": _size, "since": 4, "absent": 0})


def _launches(value: Any, where: str) -> Mapping[str, Launch]:
    # In launch order (the backward runs three entries in sequence): never sorted.
    return {name: _read(Launch, spec, _at(where, name)) for name, spec in _object(value, where).items()}


@dataclass(frozen=True)
class KernelFile:
    """One compiled program in the wheel: its file under fa_attn/ and how to launch it."""

    arch: str = _field(_arch)  # "8.0"
    image: str = _field(_image)  # "sass" | "ptx"
    file: str = _field(_str)  # "kernels/sm_80/fwd_bf16_d128.cubin", relative to fa_attn/
    unit: str = _field(_str)  # "fwd_bf16_d128"
    direction: str = _field(_direction)  # "fwd" | "bwd" | "splitkv"
    dtype: str = _field(_dtype)  # "fp16" | "bf16"
    head_dim: int = _field(_head_dim)  # the compiled head-dim bucket
    entries: Mapping[str, Launch] = _field(_launches)  # extern "C" name -> launch, in launch order
    # The CUDA major whose NVRTC compiled it: set in the all-wheel, which ships several majors' kernels
    # for one arch, and in a per-variant wheel whose kernel another major's NVRTC compiled (a cu13
    # wheel's CUDA 12 cubins); None otherwise (the wheel's WheelInfo.cuda_major) and before 1.3.
    cuda_major: int | None = dataclasses.field(
        default=None, metadata={"read": _optional(_cuda_major), "since": 3, "absent": None}
    )
    # The tile's label (tiles.py, "m128n32w4s1"); "" before 1.4. Several files may serve one head dim
    # with different tiles: the default and its alternatives for GPUs with less shared memory.
    tile: str = dataclasses.field(default="", metadata={"read": _str, "since": 4, "absent": ""})
    # Built for the arch-specific target of `arch` ("9.0a": sm_90a): it runs on compute capability
    # `arch` exactly (1.4). `arch` stays the plain capability, so a reader before 1.4 reads the file.
    arch_specific: bool = dataclasses.field(
        default=False, metadata={"read": _bool, "since": 4, "absent": False}
    )

    @property
    def target(self) -> str:
        """ "9.0a" for an arch-specific file, else its arch."""
        return target_name(self.arch, self.arch_specific)

    @property
    def smem_bytes(self) -> int:
        """The most dynamic shared memory any of its entries asks for."""
        return max((launch.smem_bytes for launch in self.entries.values()), default=0)

    @property
    def smem_needed(self) -> int:
        """The most shared memory per block any of its entries needs, static and dynamic together."""
        return max((launch.smem_bytes + launch.static_smem for launch in self.entries.values()), default=0)


@dataclass(frozen=True)
class Coverage:
    """What runs where: the head dims one compiled program serves, on one arch and image."""

    arch: str = _field(_arch)
    image: str = _field(_image)
    dtype: str = _field(_dtype)
    direction: str = _field(_direction)
    head_dims: tuple[int, ...] = _field(_tuple_of(_head_dim))  # every head dim (a multiple of 8) served
    # The most shared memory per block the program needs; None in files older than 1.1 (unknown). An
    # sm_80 cubin runs on an sm_86 GPU only if the GPU offers this much.
    smem_bytes: int | None = _field(_opt_int, since=1, absent=None)
    # The static shared memory beside `smem_bytes` (KernelFile's entries'); 0 before 1.4 (not counted).
    static_smem: int = dataclasses.field(default=0, metadata={"read": _size, "since": 4, "absent": 0})
    tile: str = dataclasses.field(
        default="", metadata={"read": _str, "since": 4, "absent": ""}
    )  # KernelFile's
    # The program is built for the arch-specific target of `arch` and runs there only (1.4; KernelFile's).
    arch_specific: bool = dataclasses.field(
        default=False, metadata={"read": _bool, "since": 4, "absent": False}
    )

    @property
    def target(self) -> str:
        return target_name(self.arch, self.arch_specific)

    @property
    def smem_needed(self) -> int | None:
        """Shared memory per block the program needs, static and dynamic together; None: unknown."""
        return None if self.smem_bytes is None else self.smem_bytes + self.static_smem


@dataclass(frozen=True)
class BindingFile:
    """One host binding of the all-wheel: what a per-variant wheel's WheelInfo says of its one binding."""

    file: str = _field(_str, since=3)  # inside fa_attn/: "bindings/libfa_attn_ops-torch2.5cxx11abifalse.so"
    torch: str = _field(_torch_minor, since=3)  # the minor it is built for; the floor of the stable form
    cxx11abi: bool | None = _field(_opt_bool, since=3)  # None: the stable form (any ABI)
    binding_form: str = _field(_one_of("aten", "stable"), since=3)
    torch_tested: tuple[str, ...] = _field(
        _tuple_of(_torch_minor), since=3
    )  # the minors the release smoke-tests it with


@dataclass(frozen=True)
class KernelSet:
    """The kernels one CUDA major's NVRTC compiled, in the all-wheel: what a per-variant wheel's WheelInfo
    says of its one major. Their files are the manifest's kernels with this `cuda_major`."""

    cuda_major: int = _field(_cuda_major, since=3)
    toolkit: str = _field(_str, since=3)
    min_driver: str = _field(_driver, since=3)  # runs its SASS from this driver on
    ptx_min_driver: str | None = _field(_optional(_driver), since=3)  # None: no PTX in this set
    sass: tuple[str, ...] = _field(_tuple_of(_arch), since=3)
    ptx: str | None = _field(_optional(_arch), since=3)
    coverage: tuple[Coverage, ...] = _field(_rows(Coverage), since=3)
    arch_specific: tuple[str, ...] = dataclasses.field(
        default=(), metadata={"read": _tuple_of(_specific_target), "since": 4, "absent": ()}
    )  # WheelInfo.arch_specific, of this set
    arch_specific_features: tuple[str, ...] = dataclasses.field(
        default=(), metadata={"read": _strs, "since": 4, "absent": ()}
    )  # WheelInfo.arch_specific_features, of this set


# ---- the documents ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WheelInfo:
    """What the manifest and the wheel's index.json entry both say."""

    version: str = _field(_str)  # "1.0.0+cu12torch2.5cxx11abifalse"
    variant: str = _field(_str, absent="")  # "cu12torch2.5cxx11abifalse"; "" for the universal wheel
    platform: str | None = _field(_opt_str, absent=None)  # the binding's CPU (x86_64, aarch64)
    cuda_major: int | None = _field(_optional(_cuda_major), absent=None)  # None: universal (no kernels)
    toolkit: str | None = _field(_opt_str, absent=None)  # the NVRTC that compiled the kernels
    min_driver: str | None = _field(_optional(_driver), absent=None)  # runs the SASS from this driver on
    ptx_min_driver: str | None = _field(_optional(_driver), absent=None)  # JIT of the PTX needs this driver
    sass: tuple[str, ...] = _field(_tuple_of(_arch), absent=())  # archs with SASS
    ptx: str | None = _field(_optional(_arch), absent=None)  # the arch of the PTX shipped
    torch: str | None = _field(_optional(_torch_minor), absent=None)  # the minor the binding is built for
    cxx11abi: bool | None = _field(_opt_bool, absent=None)  # the binding's C++ ABI
    binding: str | None = _field(_opt_str, since=1, absent=None)  # its file in fa_attn/ (BINDING_FILE)
    # "aten": built against one torch minor's C++ API (serves that minor and C++ ABI); "stable": torch's
    # stable C ABI, serves `torch` (its floor) and every later torch, any C++ ABI (binding_fit.py). Absent
    # in files before 2.2, whose bindings were all the aten form; None for the universal wheel.
    binding_form: str | None = _field(_opt_str, since=2, absent=None)
    # The torch minors the release smoke-tests the wheel with, oldest first (a stable-ABI wheel: every
    # listed minor from its floor on); a newer torch gets the torch-newer-than-tested warning.
    torch_tested: tuple[str, ...] = _field(_tuple_of(_torch_minor), since=2, absent=())
    features: tuple[str, ...] = _field(_strs, since=1, absent=())  # what the kernels implement
    coverage: tuple[Coverage, ...] = _field(_rows(Coverage), absent=())
    # The all-wheel (variant "all", 1.3): every binding and every CUDA major's kernels in one wheel; its
    # own cuda_major, binding and coverage are None/empty (a reader older than 1.3 takes it for the
    # universal wheel, and its runtime, which is new, still runs the kernels). fa_attn/runtime/all_wheel.py
    # picks one binding per torch and one set per GPU and driver. () in every other wheel.
    bindings: tuple[BindingFile, ...] = dataclasses.field(
        default=(), metadata={"read": _rows(BindingFile), "since": 3, "absent": ()}
    )
    kernel_sets: tuple[KernelSet, ...] = dataclasses.field(
        default=(), metadata={"read": _rows(KernelSet), "since": 3, "absent": ()}
    )
    # Arch-specific targets with SASS ("9.0a", 1.4): each runs on its own compute capability only
    # (versions.sass_runs_on); `sass` lists plain archs alone, so a reader before 1.4 never takes an
    # sm_90a cubin for one that runs on a later minor.
    arch_specific: tuple[str, ...] = dataclasses.field(
        default=(), metadata={"read": _tuple_of(_specific_target), "since": 4, "absent": ()}
    )
    # What the arch-specific units implement (a subset of `features`): a call using anything else is
    # passed on to the plain arch's units (decision.py).
    arch_specific_features: tuple[str, ...] = dataclasses.field(
        default=(), metadata={"read": _strs, "since": 4, "absent": ()}
    )

    @property
    def universal(self) -> bool:
        """The wheel without kernels or binding: every call falls back to torch SDPA."""
        return self.cuda_major is None and not self.kernel_sets

    @property
    def all_wheel(self) -> bool:
        """The wheel with several bindings and CUDA majors (variant "all")."""
        return bool(self.kernel_sets)


@dataclass(frozen=True)
class Manifest:
    """fa_attn/manifest.json: the wheel's info and every kernel file in it."""

    info: WheelInfo = _flat()  # noqa: RUF009 (a dataclasses.field, made by _flat)
    kernels: tuple[KernelFile, ...] = _field(_rows(KernelFile), absent=())
    # sha256 of the kernels/ sources the wheel was built from (csrc/, tiles.py, binding/, fa_attn/:
    # buildtool's kernels_src.source_hash); the GPU kit refuses a wheel whose value is not the
    # checkout's. None for the universal wheel and files older than 1.2.
    source_sha256: str | None = dataclasses.field(
        default=None, metadata={"read": _optional(_sha256), "since": 2, "absent": None}
    )

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA_MAJOR, "schema_minor": SCHEMA_MINOR, "package": PACKAGE, **_json(self)}

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        """SchemaError names the field (the caller names the file)."""
        schema_minor(_object(data, ""))
        return _read(cls, data, "")


@dataclass(frozen=True)
class IndexEntry:
    """One wheel of index.json: its file and tags, and what its manifest says (less the kernel list)."""

    file: str = _field(_wheel_file)  # the wheel's file name, next to index.json
    sha256: str = _field(_sha256)  # lower case
    size: int | None = _field(_optional(_size), absent=None)
    info: WheelInfo = _flat()  # noqa: RUF009 (a dataclasses.field, made by _flat)
    python_tag: str | None = _field(_opt_str, absent=None)
    abi_tag: str | None = _field(_opt_str, absent=None)
    platform_tag: str | None = _field(_opt_str, absent=None)
    requires_python: str | None = _field(_opt_str, absent=None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = _json(self)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str) -> IndexEntry:
        return _read(cls, data, where)


def index_json(entries: Iterable[IndexEntry]) -> dict[str, Any]:
    """index.json's content. The all-wheels go under their own key (1.3): a reader older than 1.3
    ignores a key it does not know, where it would refuse an entry of a kind it does not know."""
    entries = list(entries)
    wheels = [e.to_json() for e in entries if not e.info.all_wheel]
    alls = [e.to_json() for e in entries if e.info.all_wheel]
    head = {"schema": SCHEMA_MAJOR, "schema_minor": SCHEMA_MINOR, "package": PACKAGE}
    return {**head, "wheels": wheels, "all_wheels": alls}


def read_index(data: Any) -> tuple[IndexEntry, ...]:
    """The entries of a parsed index.json, the all-wheels last; SchemaError names the entry and the field."""
    data = _object(data, "")
    schema_minor(data)
    entries = []
    for key, absent in (("wheels", None), ("all_wheels", [])):  # all_wheels: 1.3, [] before
        rows = data.get(key, absent)
        if not isinstance(rows, list):
            raise _fail(key, rows, "a list")
        entries += [IndexEntry.from_json(raw, f"{key}[{i}]") for i, raw in enumerate(rows)]
    return tuple(entries)


def universal_info(version: str) -> WheelInfo:
    """The info of the wheel without kernels (pure Python: every call falls back to torch SDPA): each
    field's `absent` value (no variant, CUDA, torch, binding, kernels), so a new field needs no line here."""
    return _read(WheelInfo, {"version": version}, "")
