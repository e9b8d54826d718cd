"""The runtime's stdlib-only modules, which the build and doctor share with every installed wheel:
fa_attn/schema.py (manifest, index.json), reasons.py (reason codes), versions.py (arch, driver and torch
versions), decision.py (which path a call takes). Loaded from this tool's own kernels/ tree without
importing torch (core/kernels_src.py); typed as the fa_attn package they are."""

from __future__ import annotations

from typing import TYPE_CHECKING

from buildtool.core import kernels_src

if TYPE_CHECKING:
    from fa_attn import decision, reasons, schema, versions
else:
    decision = kernels_src.runtime_module("decision")
    reasons = kernels_src.runtime_module("reasons")
    schema = kernels_src.runtime_module("schema")
    versions = kernels_src.runtime_module("versions")

__all__ = ["decision", "reasons", "schema", "versions"]
