"""Fixes that name what the whole index holds.

A reason's own fix speaks of one wheel (fit.py, decision.py: "install the wheel built for torch 2.5
(`fa install` picks it)"). Read beside the rest of the index, some of those say something wrong: fa
install already chose and chose nothing (or the universal wheel), the wheel they send you to does not
exist (a win_amd64 wheel for torch 2.5), or the cause is not the matrix but how the folder was built
(`fa build --platform x86_64` read from a GH200). `refine` rewrites those fixes from `IndexFacts`;
`fa doctor` and the index page pass every reason they show through it, so they say the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from buildtool.compat.env import Env
from buildtool.core.cpus import canonical, windows_cpu
from buildtool.core.runtime import reasons, schema, versions

Reason = reasons.Reason

# The fixes that send the user to `fa install`'s own choice: circular once that choice is made.
_TORCH_CODES = ("torch-version-mismatch", "torch-below-floor")
_ABI_CODE = "cxx11abi-mismatch"
_REFINED = frozenset({*_TORCH_CODES, _ABI_CODE, "binding-unavailable", "unsupported-platform"})


@dataclass(frozen=True)
class Served:
    """The torch a set of kernel wheels serves: minors one by one, and a stable-ABI floor."""

    minors: frozenset[str] = frozenset()
    stable_from: str | None = None  # the lowest stable-ABI floor: it and every newer minor

    def serves(self, minor: str) -> bool:
        if minor in self.minors:
            return True
        return self.stable_from is not None and _key(minor) >= _key(self.stable_from)

    def text(self) -> str:
        """ "2.4 to 2.6, 2.8, 2.10 or newer": runs of consecutive minors, then the stable floor."""
        below = sorted(
            (m for m in self.minors if not self.stable_from or _key(m) < _key(self.stable_from)), key=_key
        )
        runs: list[list[str]] = []
        for minor in below:
            if runs and _key(minor) == (_key(runs[-1][-1])[0], _key(runs[-1][-1])[1] + 1):
                runs[-1].append(minor)
            else:
                runs.append([minor])
        parts = [run[0] if len(run) == 1 else f"{run[0]} to {run[-1]}" for run in runs]
        if self.stable_from:
            parts.append(f"{self.stable_from} or newer")
        return ", ".join(parts) or "none"


def _key(minor: str) -> tuple[int, int]:
    return versions.torch_version(minor)


def _served(entries: Iterable[schema.IndexEntry]) -> Served:
    minors: set[str] = set()
    floors: list[str] = []
    for entry in entries:
        info = entry.info
        bindings = info.bindings or (
            schema.BindingFile(
                info.binding or "", info.torch or "", info.cxx11abi, info.binding_form or "aten", ()
            ),
        )
        for binding in bindings:
            if not binding.torch:
                continue
            if binding.binding_form == "stable":
                floors.append(binding.torch)
            else:
                minors.add(binding.torch)
    return Served(frozenset(minors), min(floors, key=_key) if floors else None)


def os_of(entry: schema.IndexEntry) -> str:
    """The OS a wheel installs on, as Env names it: windows for win_amd64, else linux."""
    return "windows" if windows_cpu(entry.platform_tag or "") is not None else "linux"


@dataclass(frozen=True)
class IndexFacts:
    """What the fixes may name beyond one wheel: the OS and CPU pairs the kernel wheels are for and the
    torch each pair's wheels serve, and the platforms of the matrix the folder was built from (None: not
    known, e.g. an index read over HTTP)."""

    served: dict[tuple[str, str], Served]  # (os, cpu) -> the torch its kernel wheels serve
    matrix_platforms: tuple[str, ...] | None = None

    @classmethod
    def of(
        cls, entries: Sequence[schema.IndexEntry], matrix_platforms: Sequence[str] | None = None
    ) -> IndexFacts:
        pairs: dict[tuple[str, str], list[schema.IndexEntry]] = {}
        for entry in entries:
            if entry.info.universal or not entry.info.platform:
                continue
            pairs.setdefault((os_of(entry), entry.info.platform), []).append(entry)
        served = {pair: _served(group) for pair, group in pairs.items()}
        platforms = None if matrix_platforms is None else tuple(matrix_platforms)
        return cls(served, platforms)

    def cpus(self, os_name: str) -> set[str]:
        return {cpu for (os, cpu) in self.served if os == os_name}


def refine(reason: Reason, env: Env, selected: schema.IndexEntry | None, facts: IndexFacts) -> Reason:
    """`reason` with a fix that holds for this index and this choice (the reason itself when it does)."""
    fix = _fix(reason, env, selected, facts)
    return reason if fix is None else dataclasses.replace(reason, fix=fix)


def refine_all(
    found: Sequence[Reason], env: Env, selected: schema.IndexEntry | None, facts: IndexFacts
) -> tuple[Reason, ...]:
    if not any(r.code in _REFINED for r in found):
        return tuple(found)
    return tuple(refine(r, env, selected, facts) for r in found)


def _fix(reason: Reason, env: Env, selected: schema.IndexEntry | None, facts: IndexFacts) -> str | None:
    no_kernel_wheel = selected is None or selected.info.universal
    if reason.code == "binding-unavailable" and selected is not None and selected.info.universal:
        # The runtime's own fix ("`fa install`") is what picked this wheel: say why nothing better fits.
        return (
            "no kernel wheel in this index fits this machine (each one's reasons: fa doctor --all); "
            "the universal wheel runs every call on torch SDPA meanwhile"
        )
    if reason.code == "unsupported-platform":
        return _platform_fix(env, facts)
    if no_kernel_wheel and env.torch is not None and reason.code in (*_TORCH_CODES, _ABI_CODE):
        return _torch_fix(reason.code, env, facts)
    return None


def _torch_fix(code: str, env: Env, facts: IndexFacts) -> str:
    """No wheel of this index serves the installed torch: build one, or move to a torch they serve."""
    assert env.torch is not None
    minor = versions.torch_minor(env.torch.version)
    cpu = canonical(env.arch) or env.arch
    served = facts.served.get((env.os, cpu), Served())
    too_old = _key(minor) < versions.MIN_TORCH
    build = "" if too_old or env.os != "linux" else "build one for it with `fa install --build`, or "
    if code == _ABI_CODE and served.serves(minor):
        what = f"no wheel here has torch {minor}'s C++ ABI"
    else:
        what = f"no wheel here serves torch {minor}"
    return f"{what}: {build}use a torch they serve ({served.text()})"


def _platform_fix(env: Env, facts: IndexFacts) -> str | None:
    cpu = canonical(env.arch)
    if env.os == "windows" and cpu == "x86_64":
        served = facts.served.get(("windows", cpu))
        if served is None:
            return (
                "this index has no win_amd64 wheel: run on Linux (WSL2 works), or install the universal "
                "wheel (calls fall back to torch SDPA)"
            )
        return (
            f"this index's win_amd64 wheels serve torch {served.text()}: use one of those torch versions "
            "(fa install then picks the wheel), or run on Linux (WSL2 works)"
        )
    if env.os != "linux" or cpu is None or cpu in facts.cpus("linux"):
        return None  # another OS's wheels or another CPU's beside this CPU's own: the wheel's fix holds
    built = ", ".join(sorted(facts.cpus("linux"))) or "no CPU"
    if facts.matrix_platforms is not None and cpu in facts.matrix_platforms:
        return (
            f"this index holds no {cpu} wheel, though matrix.yaml lists {cpu}: it was built with "
            f"`fa build --platform {built}`; build them with `fa build --platform {cpu}` (or without "
            "--platform), or install the universal wheel (calls fall back to torch SDPA)"
        )
    if facts.matrix_platforms is not None:
        return (
            f'this index holds no {cpu} wheel and matrix.yaml builds none: add "{cpu}" to platforms '
            "in matrix.yaml and run fa build, or install the universal wheel (calls fall back)"
        )
    return (
        f"this index holds no {cpu} wheel (only {built}): build them with `fa build --platform {cpu}` "
        f'(with "{cpu}" in matrix.yaml\'s platforms), or install the universal wheel (calls fall back)'
    )
