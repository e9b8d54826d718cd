"""CPU implementations of the `fa_attn::fwd` / `fwd_splitkv` / `bwd` ops that launch the kernels on the
emulator: what the binding does around a launch (emu_harness.forward / forward_splitkv / backward).
`fa check --emulate` and tests/api (emulated.py) register them; `resolve` maps an op's module argument
(a kernel file's path) to its emulated library."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from buildtool.emucheck.harness import emulator

Resolve = Callable[[str], Any]  # module path -> emu_harness.Emulated
LAUNCHED: list[tuple[str, int]] = []  # (op, num_splits) of each emulated op call, oldest first


def _call(
    q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, used_k: Any, leftpad_k: Any, batch_idx: Any, table: Any,
    max_q: int, max_k: int, scale: float, causal: bool, wl: int, wr: int, softcap: float,
) -> Any:  # fmt: skip
    harness = emulator()
    return harness.Call(q, k, v, causal=causal, window=(wl, wr), softcap=softcap, softmax_scale=scale,
                        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                        seqused_k=used_k, leftpad_k=leftpad_k, kv_batch_idx=batch_idx, block_table=table)  # fmt: skip


@contextmanager
def kernels_on_cpu(resolve: Resolve) -> Iterator[None]:
    """The ops' CPU kernels, for as long as the context lasts."""
    harness = emulator()

    def fwd(*args: Any) -> Any:
        *call, module, _entries, _launch, _bwd_module, _bwd_entries, _bwd_launch = args
        LAUNCHED.append(("fwd", 1))
        return harness.forward(resolve(module), _call(*call))

    def fwd_splitkv(*args: Any) -> Any:
        *call, num_splits, module, _entries, _launch = args
        LAUNCHED.append(("fwd_splitkv", num_splits))
        return harness.forward_splitkv(resolve(module), _call(*call), num_splits)

    def bwd(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, cu_q: Any, cu_k: Any, max_q: int,
            max_k: int, scale: float, causal: bool, wl: int, wr: int, softcap: float, module: str,
            _entries: str, _launch: Any) -> Any:  # fmt: skip
        call = _call(
            q, k, v, cu_q, cu_k, None, None, None, None, max_q, max_k, scale, causal, wl, wr, softcap
        )
        return harness.backward(resolve(module), call, out, lse, dout)

    lib = torch.library.Library("fa_attn", "IMPL")
    lib.impl("fwd", fwd, "CPU")
    lib.impl("fwd_splitkv", fwd_splitkv, "CPU")
    lib.impl("bwd", bwd, "CPU")
    LAUNCHED.clear()
    try:
        yield
    finally:
        lib._destroy()
