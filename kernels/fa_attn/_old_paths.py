"""The module paths fa_attn had before its modules moved into runtime/, standin/ and verify/, kept
working: `import fa_attn.decision` (or `from fa_attn import decision`, or a monkeypatch of
"fa_attn.decision.x") gives the very module fa_attn.runtime.decision, not a copy, and
`python -m fa_attn.check` runs fa_attn.verify.check as before (docs/checking.md: the wheel-only way).

One table, old name -> new path under fa_attn; the finder is last on sys.meta_path, so a real file of
the old name would always win over it. Stdlib only."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import CodeType, ModuleType

PACKAGE = __name__.rpartition(".")[0]

MOVED = {
    # the runtime: call -> decide -> launch or fall back
    "inputs": "runtime.inputs",
    "call_cache": "runtime.call_cache",
    "interface": "runtime.interface",
    "packed": "runtime.packed",
    "kvcache": "runtime.kvcache",
    "decision": "runtime.decision",
    "all_wheel": "runtime.all_wheel",
    "dispatch": "runtime.dispatch",
    "loader": "runtime.loader",
    "preload": "runtime.preload",
    "ops": "runtime.ops",
    "fallback": "runtime.fallback",
    "_constant": "runtime._constant",
    # verification
    "check": "verify.check",
    "selfcheck": "verify.selfcheck",
    # fa_attn in other libraries' places
    "_standin": "standin.install",
    "flash_attn_compat": "standin.compat",
    "flash_attn_ext": "standin.extension",
    "flash_attn_privates": "standin.privates",
    "mha": "standin.mha",
    "block": "standin.block",
    "rotary": "standin.rotary",
    "norms": "standin.norms",
    "activations": "standin.activations",
    "cross_entropy": "standin.cross_entropy",
    "embedding": "standin.embedding",
    "tensor_parallel": "standin.tensor_parallel",
    "triton_attention": "standin.triton_attention",
    "bert_padding": "standin.bert_padding",
    "hf": "standin.hf",
    "sdpa": "standin.sdpa",
}


class _OldPathLoader(importlib.abc.Loader):
    """Loads an old name as the module at its new path (imported there once)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, _spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system has set __spec__ to the old name's in between: the module keeps its own.
        module.__spec__ = self.spec

    def get_code(self, fullname: str) -> CodeType:
        """`python -m fa_attn.<old>`: run the new path's module as __main__ (its own package, so its
        relative imports resolve), with sys.argv as given."""
        source = f"import runpy\nrunpy.run_module({self.target!r}, run_name='__main__', alter_sys=True)\n"
        return compile(source, f"<{fullname}: now {self.target}>", "exec")


class _OldPathFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, _path: object = None, _target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != PACKAGE or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _OldPathLoader(f"{PACKAGE}.{MOVED[name]}"))


def attribute(name: str) -> ModuleType:
    """fa_attn.<old name> as an attribute of the package (its __getattr__), as when fa_attn's
    __init__ imported those modules; the module at the new path."""
    if name not in MOVED:
        raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
    return importlib.import_module(f"{PACKAGE}.{name}")


def install() -> None:
    """Put the finder last on sys.meta_path (once)."""
    if not any(isinstance(finder, _OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(_OldPathFinder())
