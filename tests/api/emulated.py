"""fa_attn's public API on the real kernels, run by tests/emu's CPU emulator.

`kernels_on_cpu()` registers the CPU implementations of the `fa_attn::*` ops that launch the kernels
on the emulator (buildtool/emucheck/ops.py, which `fa check --emulate` uses too), and answers fa_attn's path decision with the real
`dispatch.decide` for an sm 8.0 GPU of SM_COUNT SMs and a manifest built from kernels/tiles.py. So a call
the kernels serve runs them (padding, strides, varlen offsets, GQA, KV-cache layouts, the split count of
decision.num_splits, the autograd backward), and a call they cannot serve falls back with the reason a
GPU would give.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import emu_harness as H
import tiles
import torch
from fa_attn.runtime import dispatch, interface
from fa_attn.runtime.decision import Call, Device
from fa_attn.verify import selfcheck

from buildtool.core.runtime import schema
from buildtool.emucheck import ops as emu_ops
from tests.select.fixture_index import kernel_manifest

ARCH = "8.0"
SM_COUNT = 108  # an A100's: with the tiny test shapes, decision.num_splits splits the keys
_EMULATED: dict[str, H.Emulated] = {}
LAUNCHED = emu_ops.LAUNCHED  # (op, num_splits) of each emulated op call, oldest first


def manifest(arch: str = ARCH) -> schema.Manifest:
    """The manifest `fa build` writes for a wheel with SASS for `arch` only (docs/contracts.md section 3)."""
    return kernel_manifest(12, "2.8", True, sass=(arch,), ptx=None)


def _emulated(module: str) -> H.Emulated:
    name = Path(module).stem  # kernels/sm_80/<unit>.cubin
    if name not in _EMULATED:
        unit = next(u for u in tiles.units(ARCH) if u.name == name)
        _EMULATED[name] = H.Emulated(unit, ARCH)
    return _EMULATED[name]


def gpu_key(_device: torch.device) -> selfcheck.records.RecordKey:
    """The emulated GPU, as verification records name it."""
    return selfcheck.records.RecordKey("emulated-wheel", "emulated sm 8.0", ARCH, "", torch.__version__)


def _decide(call, q, k, v, backward=None) -> dispatch.Dispatch:
    if backward is None:
        backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    facts = dispatch.CallFacts(
        Device("cuda", ARCH),
        Call(
            call.dtype_name, call.head_dim, backward, dispatch.features_of(call, backward), call.kv.page_size
        ),
    )
    return dispatch.decide(facts, manifest(), lambda: None, driver=lambda: None, package_dir=Path("/"))


@contextmanager
def kernels_on_cpu(monkeypatch):
    monkeypatch.setattr(interface, "decide", _decide)
    monkeypatch.setattr(interface, "_sm_count", lambda _device: SM_COUNT)
    # The first-use self-check is tests/api/test_selfcheck.py's subject; elsewhere it would only
    # add an emulated run per unit. Records of the emulated GPU never come from the user's cache.
    monkeypatch.setenv("FA_SELF_CHECK", "off")
    monkeypatch.setattr(selfcheck, "key_of", gpu_key)
    selfcheck.reset()
    with emu_ops.kernels_on_cpu(_emulated):
        yield
