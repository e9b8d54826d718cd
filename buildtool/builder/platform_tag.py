"""A wheel's platform tag, computed from its binaries, never assumed.

We read what each host ELF file really needs (DT_NEEDED libraries and the versioned symbols it binds:
GLIBC_*, GLIBCXX_*, CXXABI_*, GCC_*) with pyelftools and test it against auditwheel's manylinux policy
data (the JSON shipped in the auditwheel package, the same table `auditwheel show` uses). The most
compatible policy that admits every binary wins; torch's own libraries are allowed on top of the
policy's whitelist because `import torch` provides them. Nothing admits it: `linux_<arch>`.
Cubins and PTX are device code (not host ELF for this machine) and are not inspected.
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from buildtool.errors import FaError

# Provided by the user's torch at run time (loaded by `import torch` before our binding).
TORCH_LIBS = frozenset(
    {
        "libc10.so",
        "libtorch_cpu.so",
        "libtorch.so",
        "libtorch_python.so",
        "libc10_cuda.so",
        "libtorch_cuda.so",
    }
)
_MACHINE = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64"}


@dataclass(frozen=True)
class ElfNeeds:
    path: str
    arch: str  # "x86_64"
    libraries: tuple[str, ...]  # DT_NEEDED
    versions: tuple[tuple[str, str], ...]  # (library, "GLIBC_2.14"), sorted


@dataclass(frozen=True)
class PlatformTag:
    tag: str  # "manylinux_2_28_x86_64" | "linux_x86_64"
    reason: str  # why this tag and not a more compatible one (for the build log)


class PlatformTagError(FaError):
    """A binary that cannot be read as a host ELF file."""


def elf_needs(path: Path) -> ElfNeeds:
    # pyelftools here: a build with nothing changed packs no wheel, so it reads no binary's ELF
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    try:
        with path.open("rb") as f:
            elf = ELFFile(f)
            arch = _MACHINE.get(elf["e_machine"])
            if arch is None:
                raise PlatformTagError(f"{path}: {elf['e_machine']} is not a host architecture we tag")
            libs: list[str] = []
            versions: set[tuple[str, str]] = set()
            for sec in elf.iter_sections():
                if isinstance(sec, DynamicSection):
                    libs += [str(t.needed) for t in sec.iter_tags() if t.entry.d_tag == "DT_NEEDED"]  # type: ignore[attr-defined]
                elif isinstance(sec, GNUVerNeedSection):
                    for verneed, auxes in sec.iter_versions():
                        versions.update((str(verneed.name), str(aux.name)) for aux in auxes)
    except (OSError, ELFError) as e:
        raise PlatformTagError(f"{path}: not a readable ELF file: {e}") from e
    return ElfNeeds(str(path), arch, tuple(libs), tuple(sorted(versions)))


@lru_cache(maxsize=1)
def manylinux_policies() -> tuple[dict[str, Any], ...]:
    """auditwheel's policies, most compatible first (its own `priority` order); `linux` dropped."""
    text = (importlib.resources.files("auditwheel") / "policy" / "manylinux-policy.json").read_text()
    pols = [p for p in json.loads(text) if p["name"] != "linux"]
    return tuple(sorted(pols, key=lambda p: -p["priority"]))


def policy_problem(policy: dict[str, Any], needs: ElfNeeds) -> str | None:
    """Why `policy` does not admit the binary, or None if it does."""
    allowed = policy["symbol_versions"].get(needs.arch)
    if allowed is None:
        return f"{policy['name']} has no {needs.arch} data"
    for lib in needs.libraries:
        if lib not in policy["lib_whitelist"] and lib not in TORCH_LIBS:
            return f"{Path(needs.path).name} needs {lib}, not in {policy['name']}'s library whitelist"
    for lib, version in needs.versions:
        if lib in TORCH_LIBS:
            continue
        name, _, number = version.partition("_")
        if number not in allowed.get(name, ()):
            return f"{Path(needs.path).name} needs {version} (from {lib}), beyond {policy['name']}"
    return None


def platform_tag(binaries: list[Path]) -> PlatformTag:
    """The most compatible manylinux tag admitting every binary, with the reason."""
    needs = [elf_needs(p) for p in binaries]
    arches = {n.arch for n in needs}
    if len(arches) != 1:
        raise PlatformTagError(f"binaries for several or no architectures: {sorted(arches)}")
    arch = arches.pop()
    refusal = ""
    for policy in manylinux_policies():
        problems = [p for n in needs if (p := policy_problem(policy, n))]
        if not problems:
            why = f"admitted by auditwheel policy {policy['name']}"
            return PlatformTag(f"{policy['name']}_{arch}", f"{why}; not {refusal}" if refusal else why)
        refusal = problems[0]
    return PlatformTag(f"linux_{arch}", f"no manylinux policy admits it; the last refusal: {refusal}")
