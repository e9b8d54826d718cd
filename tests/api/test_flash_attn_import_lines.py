"""Import lines from public projects (flash_attn_import_lines.py) with the stand-in installed: each
resolves, or fails with fa's message; never with Python's bare "No module named" / "cannot import name".
And how a name the stand-in's modules lack fails: with fa's message under `from m import x`, as a plain
AttributeError for hasattr() and getattr(m, x, default), which real Python 3 behaviour forces (the last
test pins it down)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types

import pytest
import torch
from fa_attn.standin.install import _ABSENT, _EINOPS, _STANDS_IN
from flash_attn_import_lines import FLASH_ATTN_2_8_3, NOT_IN_FLASH_ATTN_2_8_3

pytestmark = pytest.mark.usefixtures("stand_in")


def run(statement: str) -> None:
    """Run one import statement as real code runs it (the bytecode of a `from m import x` is the point)."""
    exec(statement, {})  # noqa: S102 (the statements are this file's and flash_attn_import_lines.py's)


def outcome(statement: str) -> str:
    """ "resolves", "fa" (fails with fa's message) or "bare: <Python's error>"."""
    try:
        run(statement)
    except ImportError as error:
        return "fa" if _STANDS_IN in str(error) else f"bare: {error}"
    return "resolves"


# The flash-attn 2.8.3 modules the stand-in refuses on purpose, and why: every other line must resolve.
REFUSED = {
    "flash_attn.cute": "FlashAttention-4's CuTe-DSL interface, another API (Hopper/Blackwell kernels)",
    "flash_attn.models": "flash-attn's own model zoo and checkpoint remapping (transformers' models run on fa)",
    "flash_attn.ops.layer_norm": "the dropout_layer_norm CUDA extension (flash-attn's wheel lacks it too)",
    "flash_attn.ops.rms_norm": "the same extension (ops.triton.layer_norm's rms_norm_fn is given)",
    "flash_attn.ops.triton.k_activations": "triton.jit functions, callable only inside a Triton kernel",
    "flash_attn.ops.triton.linear": "Triton matmul kernels",
    "flash_attn.ops.triton.mlp": "Triton matmul kernels",
    "flash_attn.utils.pretrained": "downloads checkpoints from a hub",
}


def expected(statement: str) -> str:
    module = statement.split()[1]
    if any(module == prefix or module.startswith(prefix + ".") for prefix in REFUSED):
        return "fa"
    names = statement.split(" import ", 1)[1] if statement.startswith("from ") else ""
    einops = importlib.util.find_spec("einops") is not None
    if not einops and any(name.split()[0] in _EINOPS for name in names.split(", ")):
        return "fa"  # flash-attn re-exports einops' names; without einops they are refused
    return "resolves"


def test_each_line_has_its_expected_outcome() -> None:
    outcomes = {statement: outcome(statement) for statement, _repo in FLASH_ATTN_2_8_3}
    wrong = [
        f"{statement}: {result} (expected {expected(statement)})"
        for statement, result in outcomes.items()
        if result != expected(statement)
    ]
    assert not wrong, "\n".join(wrong)
    resolved = sum(result == "resolves" for result in outcomes.values())
    assert resolved >= 0.75 * len(outcomes)  # issue 35: at least 48 of 64 in the held-out set
    assert len({repo for _statement, repo in FLASH_ATTN_2_8_3}) >= 25


def test_each_resolved_name_is_an_object_of_its_kind() -> None:
    """Not None, not a stub: a module, a class, a function, or the version string."""
    for statement, _repo in FLASH_ATTN_2_8_3:
        if expected(statement) != "resolves":
            continue
        names: dict[str, object] = {}
        exec(statement, names)  # noqa: S102 (the statements are flash_attn_import_lines.py's)
        for name, value in names.items():
            if name == "__builtins__":
                continue
            if isinstance(value, str):
                assert re.fullmatch(r"2\.8\.3\+fa", value), (statement, value)
            else:
                assert isinstance(value, types.ModuleType) or callable(value), (statement, name, value)


@pytest.mark.parametrize("statement", [statement for statement, _repo in NOT_IN_FLASH_ATTN_2_8_3])
def test_lines_flash_attn_2_8_3_cannot_satisfy_do_not_resolve(statement: str) -> None:
    with pytest.raises(ImportError):
        run(statement)


@pytest.mark.parametrize("module", list(_ABSENT))
def test_each_absent_name_fails_with_fas_message(module: str) -> None:
    imported = importlib.import_module(module)
    for name in _ABSENT[module]:
        if name in _EINOPS and importlib.util.find_spec("einops") is not None:
            assert getattr(imported, name) is getattr(importlib.import_module("einops"), name)
            continue
        with pytest.raises(ImportError, match=f"cannot import name '{name}' from '{module}'") as error:
            run(f"from {module} import {name}")
        assert _STANDS_IN in str(error.value), name
        assert not hasattr(imported, name)
        assert getattr(imported, name, None) is None
        with pytest.raises(AttributeError, match=f"has no attribute '{name}': .*{re.escape(_STANDS_IN)}"):
            getattr(imported, name)


def test_fas_message_reaches_imports_in_functions_and_parenthesised_lists() -> None:
    def norm_import() -> object:
        from flash_attn.ops.triton.layer_norm import (  # type: ignore[attr-defined]
            LayerNormFn,
            RMSNorm,
        )

        return RMSNorm, LayerNormFn

    with pytest.raises(ImportError, match=f"LayerNormFn.*{_STANDS_IN}"):
        norm_import()


def test_names_flash_attn_lacks_fail_as_python_fails_them() -> None:
    import flash_attn.flash_attn_interface as interface

    with pytest.raises(ImportError) as error:
        from flash_attn.flash_attn_interface import flash_attn_unpadded_func  # type: ignore[attr-defined]  # noqa: F401
    assert str(error.value).startswith("cannot import name 'flash_attn_unpadded_func'")
    assert _STANDS_IN not in str(error.value)
    assert not hasattr(interface, "flash_attn_unpadded_func")
    assert not hasattr(interface, "__path__")  # dunder probes get a plain AttributeError


def test_interface_helpers_behave_as_flash_attn_2_8_3s() -> None:
    from flash_attn.flash_attn_interface import maybe_contiguous, round_multiple

    assert [round_multiple(x, 128) for x in (0, 1, 128, 129)] == [0, 128, 128, 256]
    assert maybe_contiguous(None) is None
    x = torch.randn(4, 8)
    assert maybe_contiguous(x) is x
    transposed = x.t()
    assert transposed.stride(-1) != 1
    fixed = maybe_contiguous(transposed)
    assert fixed is not None
    assert fixed.stride(-1) == 1
    assert torch.equal(fixed, transposed)


def test_python_keeps_no_message_of_an_attribute_error_under_from_import() -> None:
    """Why a missing name raises ImportError under `from m import x` and AttributeError elsewhere."""
    with pytest.raises(TypeError, match="lay-out conflict"):  # no exception can be both
        types.new_class("NotProvided", (ImportError, AttributeError))
    module = types.ModuleType("fa_probe_module")

    def attribute_error(name: str) -> object:
        raise AttributeError(f"fa's message about {name}")  # (the import system asks for __path__ too)

    module.__getattr__ = attribute_error  # type: ignore[method-assign]
    sys.modules[module.__name__] = module
    try:
        with pytest.raises(ImportError) as error:
            run("from fa_probe_module import x")
        assert "fa's message" not in str(error.value)  # Python's own "cannot import name" replaces it

        def import_error(name: str) -> object:
            if name.startswith("__"):  # the import system's probes (__path__)
                raise AttributeError(name)
            raise ImportError(f"fa's message about {name}")

        module.__getattr__ = import_error  # type: ignore[method-assign]
        with pytest.raises(ImportError, match="fa's message about x"):
            run("from fa_probe_module import x")
        with pytest.raises(ImportError):  # ...but hasattr() lets an ImportError through
            hasattr(module, "x")
    finally:
        del sys.modules[module.__name__]
