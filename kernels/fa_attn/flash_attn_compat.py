"""Opt-in `flash_attn` compatibility: code written for flash-attn 2.x runs on fa_attn without edits.

`fa_attn.install_as_flash_attn()` (or `python -m fa_attn.flash_attn_compat script.py args...`, which
runs a script or `-m module` with it installed) makes `import flash_attn`, `flash_attn.flash_attn_interface`,
`flash_attn.bert_padding` and `flash_attn.layers.rotary` resolve to fa_attn's functions in this process.
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
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FLASH_ATTN_API = "2.8.3"  # the flash-attn release whose public API fa_attn mirrors
SHIM_VERSION = f"{FLASH_ATTN_API}+fa"
_DIST_NAME = "flash-attn"
_MODULES = (
    "flash_attn",
    "flash_attn.flash_attn_interface",
    "flash_attn.bert_padding",
    "flash_attn.layers",
    "flash_attn.layers.rotary",
)
_PACKAGES = frozenset({"flash_attn", "flash_attn.layers"})


def _exports(fullname: str) -> dict[str, object]:
    """What each stand-in module holds (imported lazily: fa_attn is importing while this is defined)."""
    from . import bert_padding, rotary
    from .interface import flash_attn_func, flash_attn_varlen_func
    from .kvcache import flash_attn_with_kvcache
    from .packed import (
        flash_attn_kvpacked_func,
        flash_attn_qkvpacked_func,
        flash_attn_varlen_kvpacked_func,
        flash_attn_varlen_qkvpacked_func,
    )

    functions: dict[str, object] = {
        "flash_attn_func": flash_attn_func,
        "flash_attn_kvpacked_func": flash_attn_kvpacked_func,
        "flash_attn_qkvpacked_func": flash_attn_qkvpacked_func,
        "flash_attn_varlen_func": flash_attn_varlen_func,
        "flash_attn_varlen_kvpacked_func": flash_attn_varlen_kvpacked_func,
        "flash_attn_varlen_qkvpacked_func": flash_attn_varlen_qkvpacked_func,
        "flash_attn_with_kvcache": flash_attn_with_kvcache,
    }
    padding = ("pad_input", "unpad_input", "index_first_axis", "index_put_first_axis")
    modules: dict[str, dict[str, object]] = {
        "flash_attn": {**functions, "__version__": SHIM_VERSION},
        "flash_attn.flash_attn_interface": functions,
        "flash_attn.bert_padding": {name: getattr(bert_padding, name) for name in padding},
        "flash_attn.layers": {},
        "flash_attn.layers.rotary": {"apply_rotary_emb": rotary.apply_rotary_emb},
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
    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__.update(_exports(module.__name__))
        module.__fa_attn_shim__ = True  # type: ignore[attr-defined]


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

    def locate_file(self, path):
        return Path(__file__).resolve().parent / str(path)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _MODULES or _real_flash_attn() is not None:
            return None
        return importlib.util.spec_from_loader(fullname, _Loader(), is_package=fullname in _PACKAGES)

    def find_distributions(self, context=None) -> Iterator:
        name = getattr(context, "name", None)
        if name is not None and _normalize(name) != _DIST_NAME:
            return iter(())
        if _real_flash_attn() is not None:
            return iter(())
        return iter((_ShimDistribution(),))


_FINDER = _Finder()


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
            "fa_attn.install_as_flash_attn()",
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
    return flash_attn_status()


def uninstall_as_flash_attn() -> None:
    """Undo install_as_flash_attn (the stand-in modules already imported stay in sys.modules until removed)."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n, m in sys.modules.items() if getattr(m, "__fa_attn_shim__", False)]:
        del sys.modules[name]
    _forget_transformers_answers()


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


def main(argv: list[str] | None = None) -> int:
    """python -m fa_attn.flash_attn_compat [--status] (script.py | -m module) [args...]"""
    import runpy

    args = list(sys.argv[1:] if argv is None else argv)
    status = install_as_flash_attn()
    if not args or args[0] == "--status":
        print(status.message)
        return 0
    print(f"fa_attn.flash_attn_compat: {status.message}", file=sys.stderr)
    if args[0] == "-m" and len(args) > 1:
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
