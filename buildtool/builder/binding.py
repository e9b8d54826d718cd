"""The host binding (libfa_attn_ops.so): the shared launch logic (kernels/binding/*.cpp) and one form
(kernels/binding/forms/<form>.cpp) built with a C++ compiler for the wheel's CPU (the host's g++, or a
cross g++ for the other CPU: buildtool/core/cpus.py) against one torch version's headers. The ATen
form is built once per (torch minor, C++ ABI, CPU); the stable form once per CPU, against its floor's
headers with TORCH_TARGET_VERSION set to the floor (buildtool/core/binding_forms.py).

No torch library is downloaded: we link against generated stub libraries named libc10.so and
libtorch_cpu.so (the stable form: libtorch_cpu.so only, where the C shim lives), which exist only to
put DT_NEEDED entries on those sonames into our binary. At run time `import torch` has already loaded
the real ones, so the loader resolves our undefined symbols from them. The output is cached by
content: binding sources, headers (torch version and origin), form, ABI, the compiler's identity and
the flags.

The shared sources (launch.cpp, cuda_driver.cpp) include no torch header, so they are compiled once
per (CPU, C++ ABI) into cached objects that every binding of that CPU and ABI links: a release build
has ten bindings per CPU and would otherwise compile them ten times (bench/build/build.py measures it).
"""

from __future__ import annotations

import functools
import json
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from buildtool.builder.torch_headers import Headers
from buildtool.core import atomic, binding_forms, cache, children, cpus
from buildtool.core.runtime import schema
from buildtool.errors import FaError

OUTPUT_NAME = schema.BINDING_FILE  # the name the wheel ships it under, too
STUB_SONAMES = ("libc10.so", "libtorch_cpu.so")  # what torch's own libraries are called on Linux
# What each form's binary needs by name: the C shim (aoti_torch_*, torch_*) is libtorch_cpu's.
NEEDED = {binding_forms.ATEN: STUB_SONAMES, binding_forms.STABLE: ("libtorch_cpu.so",)}
# The C++ standard a form is compiled in, by its headers' torch: what torch's own cpp_extension builds
# extensions for that torch with. C++17 up to 2.14; 2.15's ATen.h refuses it, so C++20 from there on.
# Parsing torch's headers in C++17 costs less (libstdc++'s C++20 headers are larger: ranges, concepts,
# constexpr strings): about a tenth of an ATen binding's CPU (bench/build/binding_time.py).
CXX20_FROM_TORCH = (2, 15)
# The shared objects include no torch header: one standard for all, the newest the forms use.
OBJECT_STD = "-std=c++20"
BASE_FLAGS = (
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
)
# The shared objects hold the launch logic and are built once per (CPU, ABI): -O2. A form only reads
# the operators' arguments and calls torch (each call a dispatcher round trip of microseconds), and is
# built once per binding: -O1 takes a fifth less CPU there (bench/build/binding_time.py).
OBJECT_OPT = "-O2"
FORM_OPT = "-O1"
# GCC collects its own garbage whenever its heap grows by 30% past a small floor; parsing torch's
# headers makes that a few dozen collections per binding. A 1 GiB floor (the largest compile here
# peaks near 650 MB) skips them: the same output bytes (tests/builder/test_binding.py compares them).
# One binding by hand: 14 s of user CPU against 15 to 18 s; the plan's ten, `bench/build/first_command.py
# --bindings-only` at load 16: 148.8 s against 151.9 s, within the load's noise. GCC's option: GCC only.
GCC_MEMORY_PARAMS = ("--param", "ggc-min-expand=100", "--param", "ggc-min-heapsize=1048576")


class BindingError(FaError):
    """The host compiler could not build the binding; the message carries its output."""


@dataclass(frozen=True)
class BindingBuild:
    path: Path  # the cached libfa_attn_ops.so
    key: str
    cached: bool  # True: nothing compiled
    seconds: float


def compiler(platform: str | None = None) -> list[str]:
    """The compiler for bindings that run on `platform`: for this machine's CPU `CXX` (may carry a
    launcher, e.g. "ccache g++") or g++; for the other CPU its cross g++ (FA_CXX_<CPU> overrides)."""
    return cpus.cxx_for(platform or cpus.host())


def compiler_identity(platform: str | None = None) -> str:
    """The version and target triple of the compiler for `platform`'s bindings: part of the cache key
    and of the build log."""
    platform = platform or cpus.host()
    return _identity(tuple(compiler(platform)), platform)


@functools.cache
def _identity(cxx: tuple[str, ...], platform: str) -> str:
    """Asked of the compiler once per compiler file: stamped by the resolved path and file state of
    each word of the command that is a program (a launcher's too: "ccache g++"), so a build with nothing
    changed runs no g++ (three runs per compiler were a tenth of a no-op rebuild)."""
    programs = [Path(w).resolve() for w in map(shutil.which, cxx) if w]
    states = json.dumps([[str(p), cache.file_state(p)] for p in programs])
    key = cache.content_key("cxx-identity", *cxx, platform, states)
    stamp = cache.read_stamp("cxx-identity", key) if programs else None
    if stamp is not None and isinstance(stamp.get("identity"), str):
        return str(stamp["identity"])
    identity = _ask_identity(cxx, platform)
    if programs:
        cache.write_stamp("cxx-identity", key, {"identity": identity})
    return identity


def memory_params(platform: str | None = None) -> list[str]:
    """GCC_MEMORY_PARAMS for a GCC (the identity says who it is: clang answers "clang version ...");
    not in any cache key: they change how much memory the compiler keeps, never what it writes."""
    return list(GCC_MEMORY_PARAMS) if "clang" not in compiler_identity(platform).lower() else []


def _ask_identity(cxx: tuple[str, ...], platform: str) -> str:
    try:
        out = [
            subprocess.run([*cxx, flag], capture_output=True, text=True, check=True).stdout.strip()
            for flag in ("-dumpfullversion", "-dumpmachine")
        ]
        banner = subprocess.run([*cxx, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise BindingError(
            f"C++ compiler {' '.join(cxx)!r} not usable: {e}\n  fix: {cpus.cxx_install_hint(platform)}"
        ) from e
    return f"{banner.stdout.splitlines()[0]} ({out[0]}, {out[1]})"


FORMS_DIR = "forms"  # kernels/binding/forms/<form>.cpp: the thin layer that registers the operators


def form_of(stable_floor: str | None) -> str:
    return binding_forms.ATEN if stable_floor is None else binding_forms.STABLE


def sources(kernels_root: Path, form: str = binding_forms.ATEN) -> list[Path]:
    """What the binding of `form` is built from: the shared .cpp/.h files of kernels/binding, that
    form's file, and the shared params.h."""
    bind = kernels_root / "binding"
    layer = bind / FORMS_DIR / f"{form}.cpp"
    if not layer.is_file():
        raise BindingError(f"no {form} form of the binding ({layer} is missing)")
    shared = sorted(p for p in bind.glob("*") if p.suffix in (".cpp", ".cc", ".h", ".hpp"))
    return [*shared, layer, kernels_root / "csrc" / "params.h"]


def flags(headers: Headers, cxx11abi: bool, kernels_root: Path, stable_floor: str | None = None) -> list[str]:
    """Compiler flags; `stable_floor` set: the stable form, restricted to that torch's stable ABI."""
    inc = [f"-I{d}" for d in (*headers.include_dirs, kernels_root / "csrc", kernels_root / "binding")]
    target = [f"-DTORCH_TARGET_VERSION={binding_forms.target_version(stable_floor)}"] if stable_floor else []
    std = cxx_std(headers.torch_version)
    return [std, *BASE_FLAGS, FORM_OPT, f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11abi)}", *target, *inc]


def cxx_std(torch_version: str) -> str:
    """The -std flag for a form built against `torch_version`'s headers (CXX20_FROM_TORCH)."""
    try:
        release = Version(torch_version).release
    except InvalidVersion as e:
        raise BindingError(f"torch headers of version {torch_version!r}: not a version ({e})") from e
    return "-std=c++20" if release[:2] >= CXX20_FROM_TORCH else "-std=c++17"


def path_maps(headers: Headers, kernels_root: Path) -> list[str]:
    """Where the checkout and the cache are never reaches the binary: torch's headers put __FILE__
    into their checks (TORCH_CHECK, intrusive_ptr.h) and the sources are compiled by absolute path, so
    both are mapped to fixed names. With the build-id (a hash of the contents), the same sources,
    headers and compiler then give the same bytes from any checkout path and any FA_CACHE."""
    return [
        f"-ffile-prefix-map={headers.include}=/torch/include",
        f"-ffile-prefix-map={kernels_root}=/fa/kernels",
    ]


def binding_key(
    headers: Headers,
    cxx11abi: bool,
    kernels_root: Path,
    platform: str | None = None,
    stable_floor: str | None = None,
) -> str:
    """The cache key; `platform` (the binding's CPU) defaults to this machine's, like every function here."""
    platform = platform or cpus.host()
    form = form_of(stable_floor)
    srcs = sources(kernels_root, form)
    parts: list[str | bytes] = [
        "fa-binding-v1",
        headers.torch_version,
        headers.origin,
        str(cxx11abi),
        platform,
        form,
    ]
    for p in srcs:
        parts += [p.relative_to(kernels_root).as_posix(), p.read_bytes()]
    # include dirs are paths into the cache: key on what they hold (version), not where they are
    portable = [f for f in flags(headers, cxx11abi, kernels_root, stable_floor) if not f.startswith("-I")]
    parts += [compiler_identity(platform), *portable, *NEEDED[form]]
    return cache.content_key(*parts)


def output_path(key: str) -> Path:
    return cache.cache_dir() / "bindings" / key[:2] / key / OUTPUT_NAME


def stub_dir(platform: str | None = None) -> Path:
    """Empty shared libraries with torch's sonames for `platform`, generated once (they hold no code)."""
    platform = platform or cpus.host()
    d = cache.cache_dir() / "binding-stubs" / platform
    with cache.locked(d):
        for soname in STUB_SONAMES:
            lib = d / soname
            if not lib.is_file():
                with atomic.writing(lib) as tmp:
                    _run(
                        [
                            *compiler(platform),
                            "-shared",
                            "-x",
                            "c++",
                            "/dev/null",
                            f"-Wl,-soname,{soname}",
                            "-o",
                            str(tmp),
                        ],
                        f"generating stub {soname}",
                        platform,
                    )
    return d


def build_binding(
    headers: Headers,
    cxx11abi: bool,
    kernels_root: Path,
    platform: str | None = None,
    stable_floor: str | None = None,
) -> BindingBuild:
    """Build (or find in the cache) the binding; `stable_floor` set: the stable form for that floor."""
    platform = platform or cpus.host()
    key = binding_key(headers, cxx11abi, kernels_root, platform, stable_floor)
    out = output_path(key)
    if out.is_file():
        return BindingBuild(out, key, True, 0.0)
    # One compile per key across builds sharing the cache: a second build waits, then reuses it.
    with cache.locked(cache.cache_dir() / "locks" / "bindings" / key):
        if out.is_file():
            return BindingBuild(out, key, True, 0.0)
        return _compile(headers, cxx11abi, kernels_root, platform, stable_floor, key, out)


def _torch_free_sources(kernels_root: Path) -> list[Path]:
    """The shared .cpp files: they include only kernels/binding/ and csrc/ headers, never torch's."""
    return [p for p in sources(kernels_root) if p.parent == kernels_root / "binding" and p.suffix == ".cpp"]


def _object_flags(cxx11abi: bool, kernels_root: Path) -> list[str]:
    """Flags for the torch-free sources: the binding's, less torch's include dirs and the link."""
    inc = [f"-I{kernels_root / 'csrc'}", f"-I{kernels_root / 'binding'}"]
    base = [f for f in BASE_FLAGS if f != "-shared"]
    return [OBJECT_STD, *base, OBJECT_OPT, f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11abi)}", *inc]


def shared_objects(cxx11abi: bool, kernels_root: Path, platform: str) -> list[Path]:
    """The torch-free sources compiled to objects, once per (CPU, C++ ABI), cached by content: the
    sources and every header of kernels/binding and csrc/params.h (what `sources` lists), the
    compiler's identity and the flags."""
    srcs = sources(kernels_root)
    parts: list[str | bytes] = ["fa-binding-objects-v1", str(cxx11abi), platform]
    for p in srcs:
        if p.parent != kernels_root / "binding" / FORMS_DIR:  # the forms are not part of the objects
            parts += [p.relative_to(kernels_root).as_posix(), p.read_bytes()]
    portable = [f for f in _object_flags(cxx11abi, kernels_root) if not f.startswith("-I")]
    key = cache.content_key(*parts, compiler_identity(platform), *portable)
    folder = cache.cache_dir() / "binding-objects" / key[:2] / key
    objects = [folder / f"{src.stem}.o" for src in _torch_free_sources(kernels_root)]
    if all(o.is_file() for o in objects):
        return objects
    with cache.locked(cache.cache_dir() / "locks" / "binding-objects" / key):
        for src, obj in zip(_torch_free_sources(kernels_root), objects, strict=True):
            if obj.is_file():
                continue
            with atomic.writing(obj) as tmp:
                cmd = [
                    *compiler(platform),
                    *_object_flags(cxx11abi, kernels_root),
                    *memory_params(platform),
                    f"-ffile-prefix-map={kernels_root}=/fa/kernels",
                    "-c",
                    str(src),
                    "-o",
                    str(tmp),
                ]
                _run(cmd, f"compiling {src.name} for {platform} (cxx11abi={cxx11abi})", platform)
    return objects


def _compile(
    headers: Headers,
    cxx11abi: bool,
    kernels_root: Path,
    platform: str,
    stable_floor: str | None,
    key: str,
    out: Path,
) -> BindingBuild:
    t0 = time.perf_counter()
    objects = [str(o) for o in shared_objects(cxx11abi, kernels_root, platform)]
    stub_dir(platform)  # made (once per CPU) before the output file is opened
    with atomic.writing(out) as tmp:
        cmd = binding_command(headers, cxx11abi, kernels_root, platform, stable_floor, objects, tmp)
        what = (
            f"stable-ABI binding for torch >= {stable_floor} (headers {headers.torch_version})"
            if stable_floor
            else f"binding for torch {headers.torch_version} (cxx11abi={cxx11abi})"
        )
        _run(cmd, f"building the {platform} {what}", platform)
    return BindingBuild(out, key, False, time.perf_counter() - t0)


def binding_command(
    headers: Headers,
    cxx11abi: bool,
    kernels_root: Path,
    platform: str,
    stable_floor: str | None,
    objects: list[str],
    out: Path,
) -> list[str]:
    """The compiler command that builds the binding into `out` from its form's source and `objects`."""
    form = form_of(stable_floor)
    return [
        *compiler(platform),
        *flags(headers, cxx11abi, kernels_root, stable_floor),
        *path_maps(headers, kernels_root),  # not in the key: they name paths, not contents
        *memory_params(platform),  # not in the key either: the same bytes out
        str(kernels_root / "binding" / FORMS_DIR / f"{form}.cpp"),
        *objects,
        "-o",
        str(out),
        f"-L{stub_dir(platform)}",
        "-Wl,--no-as-needed",
        *(f"-l:{s}" for s in NEEDED[form]),
        "-Wl,--as-needed",
        "-ldl",  # dlopen lives in libdl before glibc 2.34 (manylinux_2_28); as-needed drops it after
    ]


def _run(cmd: list[str], what: str, platform: str) -> None:
    if shutil.which(cmd[0]) is None:
        raise BindingError(
            f"{what}: cannot run {cmd[0]}: not found\n  fix: {cpus.cxx_install_hint(platform)}"
        )
    try:
        # guarded: a killed build takes the compiler (and its cc1plus, as, ld) with it
        proc = subprocess.run(children.guarded(cmd), capture_output=True, text=True, check=False)
    except OSError as e:
        raise BindingError(
            f"{what}: cannot run {cmd[0]}: {e}\n  fix: {cpus.cxx_install_hint(platform)}"
        ) from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-40:])
        raise BindingError(f"{what} failed (exit {proc.returncode}):\n{shlex.join(cmd)}\n{tail}")
