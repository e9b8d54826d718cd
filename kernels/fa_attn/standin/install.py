"""The `flash_attn` stand-in: code written for flash-attn 2.x runs on fa_attn without edits.

`fa_attn.install_as_flash_attn()` (or `python -m fa_attn.flash_attn_compat script.py args...`, which
runs a script or `-m module` with it installed) makes `import flash_attn`, `flash_attn.flash_attn_interface`,
`flash_attn.bert_padding` and `flash_attn.layers.rotary` resolve to fa_attn's functions in this process:
the public functions, the private ones real code calls (flash_attn_privates.py) and the compiled
extension's (`flash_attn_interface.flash_attn_gpu`, flash_attn_ext.py); and the attention-adjacent
modules in plain torch: rotary (RotaryEmbedding), the norms of `flash_attn.ops.triton.layer_norm`
(norms.py), `flash_attn.losses.cross_entropy.CrossEntropyLoss` and `flash_attn.ops.triton.cross_entropy`'s
function (cross_entropy.py), `flash_attn.modules.mha.MHA` with its inner modules (mha.py;
`flash_attn.utils.generation.InferenceParams` for its decode), `flash_attn.ops.activations`
(activations.py), `flash_attn.ops.fused_dense`, `flash_attn.modules.mlp` and `flash_attn.utils.distributed`
(tensor_parallel.py), `flash_attn.modules.embedding` (embedding.py), `flash_attn.modules.block` (block.py), and the older Triton attention `flash_attn.flash_attn_triton` (triton_attention.py). Any other flash_attn module fails to import with a message naming what fa does not
provide and what to use (`_NOT_PROVIDED`), and so does a name of flash-attn 2.8.3's that a module given
here lacks (`_ABSENT`, `_module_getattr`).
It never shadows a real flash-attn: it does nothing when one is importable, and its finder sits at the
end of `sys.meta_path`, behind the path finder that finds installed packages. `flash_attn_status()`
says which one `import flash_attn` gives, and why.

What transformers checks before it uses attn_implementation="flash_attention_2"
(transformers 5.x, utils/import_utils.py `is_flash_attn_2_available`, modeling_utils.py
`_flash_attn_can_dispatch`), and what this module does about each:
  1. `importlib.util.find_spec("flash_attn")` finds a module: the finder provides one.
  2. `importlib.metadata.packages_distributions()["flash_attn"]` names a distribution "flash-attn"
     (it tells flash-attn 2 from flash-attn 4, which is also imported as flash_attn): the finder also
     provides distribution metadata, Name "flash-attn", top-level package "flash_attn", in this
     process only (pip and other processes see nothing).
  3. that distribution's version is >= 2.3.3: it is FLASH_ATTN_API plus the local label "+fa".
  4. a CUDA (or MLU/MUSA) device is available (`torch.cuda.is_available()`), and the model's weights
     are not all on the CPU: not ours to change. On a CPU, use `fa_attn.hf.register()` instead.
  The answers to 1-3 are cached (functools caches) the first time transformers asks; installing clears
  those caches when transformers is already imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import opcode
import os
import re
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLASH_ATTN_API = "2.8.3"  # the flash-attn release whose public API fa_attn mirrors
SHIM_VERSION = f"{FLASH_ATTN_API}+fa"
_DIST_NAME = "flash-attn"
# The compiled extension's module: flash-attn 2.8.3 imports it as flash_attn_gpu, and older code imports
# it directly (`import flash_attn_2_cuda`); the stand-in gives it under that name too.
_EXTENSION = "flash_attn_2_cuda"
_STANDS_IN = f"fa_attn stands in for flash-attn {FLASH_ATTN_API}'s attention API"  # in every refusal
_MODULES = (
    "flash_attn",
    "flash_attn.flash_attn_interface",
    "flash_attn.bert_padding",
    "flash_attn.flash_attn_triton",
    "flash_attn.layers",
    "flash_attn.layers.rotary",
    "flash_attn.ops",
    "flash_attn.ops.activations",
    "flash_attn.ops.fused_dense",
    "flash_attn.ops.triton",
    "flash_attn.ops.triton.cross_entropy",
    "flash_attn.ops.triton.layer_norm",
    "flash_attn.ops.triton.rotary",
    "flash_attn.losses",
    "flash_attn.losses.cross_entropy",
    "flash_attn.modules",
    "flash_attn.modules.block",
    "flash_attn.modules.embedding",
    "flash_attn.modules.mha",
    "flash_attn.modules.mlp",
    "flash_attn.utils",
    "flash_attn.utils.distributed",
    "flash_attn.utils.generation",
    _EXTENSION,
)
_PACKAGES = frozenset(
    {
        "flash_attn",
        "flash_attn.layers",
        "flash_attn.ops",
        "flash_attn.ops.triton",
        "flash_attn.losses",
        "flash_attn.modules",
        "flash_attn.utils",
    }
)
_PUBLIC = (
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
)
_PADDING = (
    "pad_input",
    "unpad_input",
    "index_first_axis",
    "index_put_first_axis",
    "index_first_axis_residual",
    "unpad_input_for_concatenated_sequences",
)

# flash-attn's other modules, which fa does not provide: the prefix, and what to use instead. An import
# of one fails with this (a ModuleNotFoundError, as without flash-attn, so `except ImportError` probes
# take their own path), never with a bare "No module named".
_NOT_PROVIDED = (
    (
        "flash_attn.ops.triton",
        "torch.nn equivalents (fa provides flash_attn.ops.triton.layer_norm, .rotary and .cross_entropy)",
    ),
    ("flash_attn.ops.rms_norm", "flash_attn.ops.triton.layer_norm.rms_norm_fn / RMSNorm (fa provides them)"),
    ("flash_attn.ops.layer_norm", "flash_attn.ops.triton.layer_norm.layer_norm_fn (fa provides it)"),
    ("flash_attn.ops", "the torch.nn equivalents (fused with torch.compile)"),
    ("flash_attn.losses", "flash_attn.losses.cross_entropy.CrossEntropyLoss (fa provides it)"),
    (
        "flash_attn.modules",
        "torch.nn modules calling fa_attn's functions (fa provides flash_attn.modules.mha)",
    ),
    ("flash_attn.utils", "torch's own utilities (fa provides flash_attn.utils.generation.InferenceParams)"),
    ("flash_attn.models", "transformers' models with attn_implementation=fa_attn.hf.register()"),
    ("flash_attn.layers", "torch.nn layers (fa provides flash_attn.layers.rotary)"),
    ("flash_attn.cute", "fa_attn's functions (FlashAttention-4's CuTe kernels are not in fa)"),
    ("flash_attn", "fa_attn's functions (fa_attn.flash_attn_status() lists what the stand-in gives)"),
)


# flash-attn 2.8.3's names in the modules the stand-in gives, which fa does not provide: each module's
# top-level definitions, its re-exports of flash_attn's and einops' names, and a package's submodules
# (recorded from flash-attn's source at tag v2.8.3). Importing one fails with fa's message
# (missing_name); a name flash-attn does not have either fails as Python fails it.
_ABSENT: dict[str, tuple[str, ...]] = {
    "flash_attn": (
        "cute", "flash_attn_triton_amd", "flash_attn_triton_og",
        "flash_blocksparse_attention", "flash_blocksparse_attn_interface", "models",
    ),
    "flash_attn.flash_attn_interface": (
        "FlashAttnFunc", "FlashAttnKVPackedFunc", "FlashAttnQKVPackedFunc", "FlashAttnVarlenFunc",
        "FlashAttnVarlenKVPackedFunc", "FlashAttnVarlenQKVPackedFunc", "USE_TRITON_ROCM",
        "_flash_attn_backward_fake", "_flash_attn_forward_fake", "_flash_attn_varlen_backward_fake",
        "_flash_attn_varlen_forward_fake", "_get_block_size_n", "_torch_custom_op_wrapper",
        "_torch_register_fake_wrapper", "noop_custom_op_wrapper", "noop_register_fake_wrapper",
    ),
    "flash_attn.bert_padding": ("IndexFirstAxis", "IndexFirstAxisResidual", "IndexPutFirstAxis", "rearrange", "repeat"),
    "flash_attn.layers": ("patch_embed",),
    "flash_attn.layers.rotary": ("_apply_rotary_emb_qkv", "rearrange", "repeat"),
    "flash_attn.ops": ("layer_norm", "rms_norm"),
    "flash_attn.ops.triton": ("k_activations", "linear", "mlp"),
    "flash_attn.ops.triton.rotary": ("rotary_kernel",),
    "flash_attn.ops.triton.layer_norm": (
        "LayerNormFn", "LayerNormLinearFn", "_layer_norm_bwd", "_layer_norm_bwd_impl", "_layer_norm_bwd_kernel",
        "_layer_norm_fwd", "_layer_norm_fwd_1pass_kernel", "_layer_norm_fwd_impl", "custom_bwd", "custom_fwd",
        "maybe_contiguous", "maybe_contiguous_lastdim", "triton_autotune_configs", "triton_op",
    ),
    "flash_attn.modules.mha": ("_update_kv_cache", "rearrange", "repeat"),
    "flash_attn.utils": ("benchmark", "library", "pretrained", "testing", "torch"),
    "flash_attn.utils.generation": (
        "DecodingCGCache", "GenerationMixin", "GreedySearchDecoderOnlyOutput", "SampleDecoderOnlyOutput",
        "allocate_inference_cache", "capture_graph", "decode", "decode_speculative",
        "modify_logits_for_top_k_filtering", "modify_logits_for_top_p_filtering", "sample",
        "sample_speculative", "update_graph_cache", "rearrange", "repeat",
    ),
}  # fmt: skip
_EINOPS = (
    "rearrange",
    "repeat",
)  # flash-attn's modules import them from einops, a dependency of flash-attn's
_IMPORT_FROM = opcode.opmap["IMPORT_FROM"]


def missing_name(module: str, name: str) -> str | None:
    """Why the stand-in's `module` lacks a name flash-attn 2.8.3's has, and what to use (None: flash-attn
    2.8.3 lacks it too)."""
    if name not in _ABSENT.get(module, ()):
        return None
    submodule = f"{module}.{name}"
    if module in _PACKAGES:  # a package's absent names are its submodules
        return not_provided(submodule)
    if name in _EINOPS:
        instead = (
            f"`from einops import {name}` (flash-attn re-exports einops' {name} here; pip install einops)"
        )
    else:
        gives = sorted(key for key in _exports(module) if not key.startswith("_"))
        instead = f"what {module} gives here: {', '.join(gives)}" if gives else "fa_attn's functions"
    return f"{_STANDS_IN} and does not provide {submodule}; use {instead}"


def _module_getattr(module: str) -> Any:
    """A stand-in module's __getattr__: flash-attn 2.8.3's names that fa lacks fail with fa's message.
    `from m import x` turns an AttributeError into its own "cannot import name" text (and an exception
    cannot be both an ImportError and an AttributeError: their layouts conflict), while hasattr() and
    getattr(m, x, default) swallow only AttributeError. So the error is an ImportError when the caller is
    executing IMPORT_FROM, and an AttributeError (carrying the same message) otherwise."""

    def __getattr__(name: str) -> object:
        if name in _EINOPS and name in _ABSENT.get(module, ()) and importlib.util.find_spec("einops"):
            return getattr(importlib.import_module("einops"), name)
        why = missing_name(module, name)
        if why is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}", name=name)
        caller = sys._getframe(1)
        if 0 <= caller.f_lasti < len(caller.f_code.co_code) and (
            caller.f_code.co_code[caller.f_lasti] == _IMPORT_FROM
        ):
            raise ImportError(f"cannot import name {name!r} from {module!r}: {why}", name=module)
        raise AttributeError(f"module {module!r} has no attribute {name!r}: {why}", name=name)

    return __getattr__


def not_provided(fullname: str) -> str:
    """The message for a flash_attn module the stand-in does not give. Python imports a dotted name's
    parents first, so `flash_attn.ops.triton.layer_norm` fails at `flash_attn.ops`: the message names
    what to use for that module and for each module under it."""
    instead = next(
        use for prefix, use in _NOT_PROVIDED if fullname == prefix or fullname.startswith(prefix + ".")
    )
    below = [f"for {prefix}: {use}" for prefix, use in _NOT_PROVIDED if prefix.startswith(fullname + ".")]
    given = ", ".join(name for name in _MODULES if name not in _PACKAGES or name == "flash_attn")
    return (
        f"No module named {fullname!r}: {_STANDS_IN} ({given}) and does not provide {fullname}; use {instead}"
        + "".join(f"; {line}" for line in below)
    )


def _exports(fullname: str) -> dict[str, object]:
    """What each stand-in module holds (imported lazily: fa_attn is importing while this is defined)."""
    from ..runtime import interface, kvcache, packed
    from . import (
        activations,
        bert_padding,
        block,
        cross_entropy,
        embedding,
        mha,
        norms,
        rotary,
        tensor_parallel,
        triton_attention,
    )
    from . import extension as flash_attn_ext
    from . import privates as flash_attn_privates

    public = {name: getattr(interface, name, None) or getattr(packed, name, None) for name in _PUBLIC}
    public["flash_attn_with_kvcache"] = kvcache.flash_attn_with_kvcache
    interface_module = {
        **public,
        **{name: getattr(flash_attn_privates, name) for name in flash_attn_privates.NAMES},
        "flash_attn_gpu": flash_attn_ext.module(),
    }
    modules: dict[str, dict[str, object]] = {
        "flash_attn": {**public, "__version__": SHIM_VERSION},
        "flash_attn.flash_attn_interface": interface_module,
        "flash_attn.bert_padding": {name: getattr(bert_padding, name) for name in _PADDING},
        "flash_attn.layers": {},
        "flash_attn.layers.rotary": {
            "apply_rotary_emb": rotary.apply_rotary_emb,
            "apply_rotary_emb_func": rotary.apply_rotary_emb,  # flash-attn's alias
            "apply_rotary_emb_qkv_": rotary.apply_rotary_emb_qkv_,
            "apply_rotary_emb_kv_": rotary.apply_rotary_emb_kv_,
            "apply_rotary_emb_torch": rotary.apply_rotary_emb_torch,
            "apply_rotary": rotary.apply_rotary,  # flash-attn imports it here from ops.triton.rotary
            "rotate_half": rotary.rotate_half,
            "ApplyRotaryEmb": rotary._ApplyRotary,
            "ApplyRotaryEmbQKV_": rotary._ApplyRotaryPacked,
            "ApplyRotaryEmbKV_": rotary._ApplyRotaryKV,
            "RotaryEmbedding": rotary.RotaryEmbedding,
        },
        "flash_attn.ops": {},
        "flash_attn.ops.triton": {},
        "flash_attn.ops.triton.layer_norm": {
            "layer_norm_fn": norms.layer_norm_fn,
            "rms_norm_fn": norms.rms_norm_fn,
            "RMSNorm": norms.RMSNorm,
            "layer_norm_ref": norms.layer_norm_ref,
            "rms_norm_ref": norms.rms_norm_ref,
            "layer_norm_linear_fn": norms.layer_norm_linear_fn,
        },
        "flash_attn.ops.triton.rotary": {"apply_rotary": rotary.apply_rotary},
        "flash_attn.losses": {},
        "flash_attn.losses.cross_entropy": {
            "CrossEntropyLoss": cross_entropy.CrossEntropyLoss,
            "cross_entropy_loss": cross_entropy.cross_entropy_loss,
        },
        "flash_attn.ops.triton.cross_entropy": {"cross_entropy_loss": cross_entropy.cross_entropy_loss},
        "flash_attn.ops.activations": {name: getattr(activations, name) for name in activations.NAMES},
        "flash_attn.ops.fused_dense": {
            name: getattr(tensor_parallel, name) for name in tensor_parallel.FUSED_DENSE_NAMES
        },
        "flash_attn.flash_attn_triton": {
            name: getattr(triton_attention, name) for name in triton_attention.NAMES
        },
        "flash_attn.modules": {},
        "flash_attn.modules.mha": {
            **{name: getattr(mha, name) for name in mha.__all__},
            **{  # flash-attn's mha.py imports them
                name: getattr(tensor_parallel, name)
                for name in ("ColumnParallelLinear", "RowParallelLinear", "get_dim_for_local_rank")
            },
        },
        "flash_attn.modules.mlp": {
            name: getattr(tensor_parallel, name) for name in tensor_parallel.MLP_NAMES
        },
        "flash_attn.modules.embedding": {name: getattr(embedding, name) for name in embedding.NAMES},
        "flash_attn.modules.block": {name: getattr(block, name) for name in block.NAMES},
        "flash_attn.utils": {},
        "flash_attn.utils.distributed": {
            name: getattr(tensor_parallel, name) for name in tensor_parallel.DISTRIBUTED_NAMES
        },
        "flash_attn.utils.generation": {"InferenceParams": mha.InferenceParams},
        _EXTENSION: {
            name: getattr(interface_module["flash_attn_gpu"], name) for name in flash_attn_ext.NAMES
        },
    }
    return modules[fullname]


def _real_flash_attn() -> importlib.machinery.ModuleSpec | None:
    """The spec of an installed flash_attn that is not this stand-in, if any."""
    module = sys.modules.get("flash_attn")
    if module is not None and not getattr(module, "__fa_attn_shim__", False):
        return getattr(module, "__spec__", None) or importlib.machinery.ModuleSpec("flash_attn", None)
    for finder in sys.meta_path:
        if finder is _FINDER or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec("flash_attn", None)
        if spec is not None:
            return spec
    return None


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__.update(_exports(module.__name__))
        module.__getattr__ = _module_getattr(module.__name__)  # type: ignore[method-assign]
        module.__fa_attn_shim__ = True  # type: ignore[attr-defined]
        if (
            module.__name__ == "flash_attn"
        ):  # flash-attn's __init__ imports it: `flash_attn.flash_attn_interface`
            importlib.import_module("flash_attn.flash_attn_interface")


class _ShimDistribution(importlib.metadata.Distribution):
    """Metadata of the stand-in, for the checks transformers makes (module docstring)."""

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return (
                "Metadata-Version: 2.1\n"
                f"Name: {_DIST_NAME}\n"
                f"Version: {SHIM_VERSION}\n"
                "Summary: fa_attn standing in for flash-attn (fa_attn.install_as_flash_attn)\n"
            )
        if filename == "top_level.txt":
            return "flash_attn\n"
        return None

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        return Path(__file__).resolve().parents[1] / str(path)  # fa_attn/, where the package lies


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "flash_attn" and not fullname.startswith("flash_attn.") and fullname != _EXTENSION:
            return None
        if _real_flash_attn() is not None:
            return None
        if fullname not in _MODULES:
            raise ModuleNotFoundError(not_provided(fullname), name=fullname)
        # A real file as origin, so the modules have a __file__ (libraries read it to find the package).
        spec = importlib.machinery.ModuleSpec(
            fullname, _Loader(), origin=str(_ORIGIN), is_package=fullname in _PACKAGES
        )
        spec.has_location = True
        return spec

    def find_distributions(self, context: object = None) -> Iterator[Any]:
        name = getattr(context, "name", None)
        if name is not None and _normalize(name) != _DIST_NAME:
            return iter(())
        if _real_flash_attn() is not None:
            return iter(())
        return iter((_ShimDistribution(),))


_FINDER = _Finder()
_ORIGIN = Path(__file__).resolve().parent / "compat.py"


@dataclass(frozen=True)
class FlashAttnStatus:
    """Which module `import flash_attn` gives in this process."""

    provider: str  # "flash-attn" (a real install), "fa_attn" (this stand-in) or "none"
    version: str | None
    origin: str | None  # where the real one lives; None for the stand-in
    message: str


def flash_attn_status() -> FlashAttnStatus:
    """Which flash_attn is active here (without importing it)."""
    real = _real_flash_attn()
    if real is not None:
        try:
            version = importlib.metadata.version(_DIST_NAME)
        except importlib.metadata.PackageNotFoundError:
            version = None
        return FlashAttnStatus(
            "flash-attn",
            version,
            real.origin,
            f"`import flash_attn` gives the installed flash-attn {version or '(version unknown)'} "
            f"({real.origin}); fa_attn does not replace it",
        )
    if _FINDER in sys.meta_path:
        return FlashAttnStatus(
            "fa_attn",
            SHIM_VERSION,
            None,
            f"`import flash_attn` gives fa_attn (flash-attn {FLASH_ATTN_API} API), installed by "
            'fa_attn.install_as_flash_attn(); transformers\' attn_implementation="flash_attention_2" also '
            "needs a CUDA device: on a CPU use attn_implementation=fa_attn.hf.register()",
        )
    return FlashAttnStatus(
        "none", None, None, "no flash_attn here; call fa_attn.install_as_flash_attn() to let fa_attn stand in"
    )


def install_as_flash_attn() -> FlashAttnStatus:
    """Let fa_attn stand in for flash_attn in this process, unless a real flash-attn is importable.
    Returns flash_attn_status(): what `import flash_attn` gives now."""
    if _real_flash_attn() is None and _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)  # last: an installed flash-attn is always found first
        _forget_transformers_answers()
        _refresh_diffusers()
    return flash_attn_status()


def uninstall_as_flash_attn() -> None:
    """Undo install_as_flash_attn (the stand-in modules already imported stay in sys.modules until removed)."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n, m in sys.modules.items() if getattr(m, "__fa_attn_shim__", False)]:
        del sys.modules[name]
    _forget_transformers_answers()
    _refresh_diffusers()


def _forget_transformers_answers() -> None:
    """transformers caches whether flash_attn is available (lru_cache); ask again after a change."""
    utils = sys.modules.get("transformers.utils.import_utils")
    for name in (
        "_package_distribution_mapping",
        "is_flash_attn_2_available",
        "is_flash_attn_greater_or_equal",
    ):
        clear = getattr(getattr(utils, name, None), "cache_clear", None)
        if clear is not None:
            clear()


# diffusers.models.attention_dispatch's names for flash-attn 2: the functions it imports from each module.
_DIFFUSERS_IMPORTS = {
    "flash_attn": ("flash_attn_func", "flash_attn_varlen_func"),
    "flash_attn.flash_attn_interface": ("_wrapped_flash_attn_backward", "_wrapped_flash_attn_forward"),
}


def _refresh_diffusers() -> None:
    """diffusers decides at import whether flash_attn is there: utils.import_utils keeps
    (_flash_attn_available, _flash_attn_version), and models.attention_dispatch keeps _CAN_USE_FLASH_ATTN
    and the functions it imported (None without flash_attn). Ask diffusers' own probe again, and set the
    dispatch module's names as its import would have."""
    utils = sys.modules.get("diffusers.utils.import_utils")
    probe = getattr(utils, "_is_package_available", None)
    if utils is None or probe is None or not hasattr(utils, "_flash_attn_available"):
        return
    available, version = probe("flash_attn")
    utils.__dict__.update(_flash_attn_available=available, _flash_attn_version=version)
    dispatch = sys.modules.get("diffusers.models.attention_dispatch")
    if dispatch is None or not hasattr(dispatch, "_CAN_USE_FLASH_ATTN"):
        return
    required = getattr(dispatch, "_REQUIRED_FLASH_VERSION", "0")
    usable = bool(utils.is_flash_attn_available() and utils.is_flash_attn_version(">=", required))
    for module_name, names in _DIFFUSERS_IMPORTS.items():
        module = importlib.import_module(module_name) if usable else None
        for name in names:
            if hasattr(dispatch, name):
                setattr(dispatch, name, getattr(module, name) if module is not None else None)
    dispatch.__dict__["_CAN_USE_FLASH_ATTN"] = usable
