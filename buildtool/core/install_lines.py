"""Which per-variant index a wheel is published in, and the pip and uv lines that install it from there.

Every fa-attn wheel carries the same `py3-none-<platform>` tags, so pip and uv, shown all of them, take
the highest local label (`+cu13torch2.9` over `+cu12torch2.10plus`), whatever torch is installed. So, as
PyTorch does (download.pytorch.org/whl/cu126), each variant gets its own PEP 503 index holding only its
wheels plus the ones every machine may take (the all-wheel, variant "all", and the universal wheel):
from it, pip's highest version is that variant's wheel on the CPUs it is built for, and the all-wheel
or the universal wheel elsewhere. The root index `<base>/simple/` holds only those two kinds, like
PyPI, so pointing pip at it is never wrong either; and `<base>/universal/simple/` the universal wheel
alone, for a machine where `fa install` picks it although an all-wheel would install (the all-wheel's
bindings serve no torch there, so it would only fall back too).

Index names are what a person can guess from `torch.version.cuda` and `torch.__version__`:
- `cu12`: the stable-ABI wheel (`cu12torch2.10plus`), which serves torch 2.10 and every later minor;
- `cu12-torch2.9`: a per-minor wheel (`cu12torch2.9`) for torch 2.9;
- `cu12-torch2.5-cxx11abifalse`: a per-minor wheel whose variant names its C++ ABI (below torch 2.7,
  where PyPI used the old ABI and NGC the new one: `torch._C._GLIBCXX_USE_CXX11_ABI`);
- `universal`: the wheel without kernels (every call falls back to torch SDPA).

Pure: used by `fa build`/`fa index` (the indexes they write), `fa doctor` (the lines it prints) and
the index's web page, so all three name the same index and the same lines.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.version import Version

from buildtool.core.runtime import schema

SIMPLE = "simple"  # every index's PEP 503 root, under <base>/ or <base>/<variant index>/
UNIVERSAL = "universal"  # the index holding the universal wheel alone


def variant_index_name(entry: schema.IndexEntry) -> str | None:
    """The name of the index a wheel installs from (`cu12`, `cu12-torch2.9`,
    `cu12-torch2.5-cxx11abifalse`, `universal`); None for the all-wheel, which installs from the root
    index. The all-wheel and the universal wheel are also in every variant's index."""
    info = entry.info
    if info.all_wheel:
        return None
    if info.universal or info.cuda_major is None:
        return UNIVERSAL
    if info.binding_form == "stable":
        return f"cu{info.cuda_major}"
    name = f"cu{info.cuda_major}-torch{info.torch}"
    # The label names the ABI only where it is ambiguous (wheel_file.check_agreement holds the two equal).
    if "cxx11abi" in info.variant and info.cxx11abi is not None:
        name += f"-cxx11abi{str(info.cxx11abi).lower()}"
    return name


def in_every_index(entry: schema.IndexEntry) -> bool:
    """The wheels any machine may take: the all-wheel (its runtime picks a binding and kernels) and the
    universal wheel (no kernels). Their version has no local label, so a variant's wheel outranks them
    wherever its tags fit."""
    return entry.info.all_wheel or variant_index_name(entry) == UNIVERSAL


def index_names(entries: Iterable[schema.IndexEntry]) -> tuple[str, ...]:
    """Every index a set of wheels makes besides the root one, sorted."""
    return tuple(sorted({n for n in map(variant_index_name, entries) if n is not None}))


def index_members(entries: Iterable[schema.IndexEntry], name: str | None) -> list[schema.IndexEntry]:
    """The wheels of one index: a variant's own plus the all-wheels and the universal wheel; the root
    index (`name` None) holds those two kinds only, the `universal` index the universal wheel alone."""
    if name == UNIVERSAL:
        return [e for e in entries if variant_index_name(e) == UNIVERSAL]
    return [e for e in entries if in_every_index(e) or variant_index_name(e) == name]


def index_path(name: str | None) -> str:
    """Where an index sits under the base: `simple/` (root) or `cu12/simple/`."""
    return f"{SIMPLE}/" if name is None else f"{name}/{SIMPLE}/"


def index_url(base_url: str, name: str | None) -> str:
    """The index URL pip and uv take (`https://host/fa/cu12/simple/`, `file:///srv/wheels/cu12/simple/`)."""
    return f"{base_url.rstrip('/')}/{index_path(name)}"


@dataclass(frozen=True)
class InstallLines:
    """What installs one chosen wheel from its index, each ready to paste."""

    index_name: str | None  # None: the root index (the all-wheel)
    index_url: str
    requirement: str  # fa-attn==<public version>: the release, whichever label the index adds
    pip: str  # a shell command
    uv: str  # a shell command (uv's pip interface)
    requirements_txt: str  # lines for a requirements file
    uv_pyproject: str  # a pyproject.toml snippet: the index, and fa-attn pinned to it


def uv_index_name(name: str | None) -> str:
    """The `[[tool.uv.index]]` name: letters, digits, `-`, `_` and `.`, as uv requires."""
    return f"fa-{name}" if name is not None else "fa"


def _toml(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's for every character a URL or a name holds."""
    return json.dumps(text)


def install_lines(entry: schema.IndexEntry, base_url: str) -> InstallLines:
    """The lines that install `entry` from the indexes under `base_url`. The requirement pins the public
    version: `==1.0.0` matches `1.0.0+cu12torch2.10plus` (PEP 440 ignores the local label of a candidate
    when the specifier has none), so the index decides the variant and the pin the release.
    `--index-url` (not `--extra-index-url`): fa-attn has no dependencies, and PyPI's fa-attn (the
    all-wheel) must not compete with the variant's wheel."""
    name = variant_index_name(entry)
    url = index_url(base_url, name)
    requirement = f"{schema.PACKAGE}=={Version(entry.info.version).public}"
    quoted = shlex.quote(requirement)
    uv_name = uv_index_name(name)
    pyproject = "\n".join(
        (
            "[project]",
            f"dependencies = [{_toml(requirement)}]",
            "",
            "[[tool.uv.index]]",
            f"name = {_toml(uv_name)}",
            f"url = {_toml(url)}",
            "explicit = true  # only the packages pinned to it below come from it",
            "",
            "[tool.uv.sources]",
            f"{schema.PACKAGE} = {{ index = {_toml(uv_name)} }}",
        )
    )
    return InstallLines(
        index_name=name,
        index_url=url,
        requirement=requirement,
        pip=f"pip install --index-url {shlex.quote(url)} {quoted}",
        uv=f"uv pip install --index-url {shlex.quote(url)} {quoted}",
        requirements_txt=f"--index-url {url}\n{requirement}",
        uv_pyproject=pyproject,
    )
