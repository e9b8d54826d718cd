"""The runtime's stdlib-only modules, which the build and doctor share with every installed wheel:
fa_attn/schema.py (manifest, index.json), reasons.py (reason codes), versions.py (arch, driver and torch
versions), decision.py (which path a call takes), all_wheel.py (the all-wheel's binding and kernel set),
ownfiles.py (how fa reads, writes and locks its own files).
Loaded from this tool's own kernels/ tree without
importing torch (core/kernels_src.py), each on first use (`fa probe` needs versions.py only); typed as
the fa_attn package they are."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from buildtool.core import kernels_src

if TYPE_CHECKING:
    from fa_attn import ownfiles, reasons, schema, versions
    from fa_attn.runtime import all_wheel, decision

__all__ = ["all_wheel", "decision", "ownfiles", "reasons", "schema", "versions"]


def __getattr__(name: str) -> ModuleType:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Where each sits inside fa_attn/ when not at its top: the runtime's own table of moved modules.
    moved = kernels_src.runtime_module("_old_paths").MOVED
    module = kernels_src.runtime_module(moved.get(name, name))
    globals()[name] = module
    return module
