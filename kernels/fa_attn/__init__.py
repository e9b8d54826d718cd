"""fa_attn: fused CUDA attention for PyTorch with flash-attn 2.x's API, and a torch SDPA fallback.

Importing is cheap and needs no GPU: it defines the `fa_attn::fwd/bwd` op schemas and fake kernels;
the wheel's host binding (CUDA kernels) loads on the first CUDA call. Ask which path a call took with
`last_dispatch()`, or which it would take with `explain(q, k, v, ...)`. Set FA_STRICT=1 to make any
fallback an error instead of a one-time FaFallbackWarning.

flash-attn's whole public API is here (the seven functions, and `fa_attn.bert_padding`);
`install_as_flash_attn()` lets fa_attn stand in for `import flash_attn`; `fa_attn.hf.register()` makes
it a transformers attention implementation; on torch >= 2.13,
`torch.nn.attention.activate_flash_attention_impl("fa")` makes it SDPA's flash path (sdpa.py).
"""

from __future__ import annotations

try:
    import torch as _torch
except ModuleNotFoundError as _missing:
    if _missing.name != "torch":
        raise
    raise ImportError(
        "fa_attn is a torch extension and torch is not installed here: install torch first "
        "(https://pytorch.org/get-started/locally/), then `fa install` (or `fa doctor` for the pip and uv "
        "lines) to get the fa-attn wheel built for that torch"
    ) from None

from .versions import MIN_TORCH as _MIN_TORCH
from .versions import torch_version as _torch_version
from .versions import version_text as _version_text

if _torch_version(_torch.__version__) < _MIN_TORCH:
    raise ImportError(
        f"fa_attn needs torch >= {_version_text(_MIN_TORCH)} (torch.library's fake and "
        f"autograd registration); this is torch {_torch.__version__}: upgrade torch"
    )

from . import _old_paths
from .reasons import Reason
from .runtime import ops as _ops  # noqa: F401  (defines the fa_attn:: op schemas)
from .runtime.dispatch import Dispatch, FaFallbackError, FaFallbackWarning, last_dispatch
from .runtime.dispatch import driver_version as _driver_version
from .runtime.interface import explain, flash_attn_func, flash_attn_varlen_func
from .runtime.kvcache import flash_attn_with_kvcache
from .runtime.loader import FaUntestedTorchWarning, FaWheelMisfitWarning
from .runtime.loader import manifest as _manifest
from .runtime.loader import warn_misfit as _warn_misfit
from .runtime.packed import (
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from .standin import bert_padding, hf
from .standin import sdpa as _sdpa
from .standin.install import flash_attn_status, install_as_flash_attn

# The module paths before runtime/, standin/ and verify/ (`import fa_attn.decision`, `python -m
# fa_attn.check`) are the modules at their new paths (_old_paths.py).
_old_paths.install()


def __getattr__(name: str) -> object:
    """fa_attn.decision, fa_attn.loader, ...: the old module names as attributes too (_old_paths.py)."""
    return _old_paths.attribute(name)


# This wheel's version ("0.1.0+cu12torch2.8"), from its manifest; in a source checkout, fa's own
# (_version.py, the one source every version starts from).
__version__ = _manifest().info.version

# A wheel built for another torch, C++ ABI or driver imports, says so once, and falls back.
_warn_misfit(_manifest(), _driver_version())

# torch >= 2.13: SDPA's flash path can run on fa after
# torch.nn.attention.activate_flash_attention_impl("fa"); registering activates nothing (sdpa.py).
_sdpa.register()

__all__ = [
    "Dispatch",
    "FaFallbackError",
    "FaFallbackWarning",
    "FaUntestedTorchWarning",
    "FaWheelMisfitWarning",
    "Reason",
    "bert_padding",
    "explain",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_status",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "hf",
    "install_as_flash_attn",
    "last_dispatch",
]
