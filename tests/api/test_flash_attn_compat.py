"""The opt-in flash_attn stand-in: imports resolve to fa_attn, transformers' availability checks pass
(except the GPU one), and an installed flash-attn is never shadowed."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fa_attn
import pytest
from fa_attn.standin import compat as flash_attn_compat

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.usefixtures("clean_flash_attn")
def test_no_flash_attn_without_opting_in() -> None:
    assert importlib.util.find_spec("flash_attn") is None
    status = fa_attn.flash_attn_status()
    assert status.provider == "none"
    assert "install_as_flash_attn" in status.message


@pytest.mark.usefixtures("clean_flash_attn")
def test_install_gives_fa_attn_as_flash_attn() -> None:
    status = fa_attn.install_as_flash_attn()
    assert status.provider == "fa_attn"
    assert status.version == flash_attn_compat.SHIM_VERSION
    import flash_attn
    from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    from flash_attn.bert_padding import index_first_axis, pad_input, unpad_input
    from flash_attn.flash_attn_interface import flash_attn_qkvpacked_func
    from flash_attn.layers.rotary import apply_rotary_emb

    assert flash_attn_func is fa_attn.flash_attn_func
    assert flash_attn_varlen_func is fa_attn.flash_attn_varlen_func
    assert flash_attn_with_kvcache is fa_attn.flash_attn_with_kvcache
    assert flash_attn_qkvpacked_func is fa_attn.flash_attn_qkvpacked_func
    assert pad_input is fa_attn.bert_padding.pad_input
    assert unpad_input is fa_attn.bert_padding.unpad_input
    assert index_first_axis is fa_attn.bert_padding.index_first_axis
    assert apply_rotary_emb is fa_attn.rotary.apply_rotary_emb
    assert flash_attn.__version__ == flash_attn_compat.SHIM_VERSION
    assert fa_attn.install_as_flash_attn().provider == "fa_attn"  # twice is harmless


@pytest.mark.usefixtures("clean_flash_attn")
def test_what_transformers_checks() -> None:
    """transformers' is_flash_attn_2_available, steps 1-3 (flash_attn_compat's docstring), by hand."""
    from packaging import version

    fa_attn.install_as_flash_attn()
    assert importlib.util.find_spec("flash_attn") is not None
    assert "flash-attn" in importlib.metadata.packages_distributions().get("flash_attn", [])
    assert version.parse(importlib.metadata.version("flash_attn")) >= version.parse("2.3.3")
    assert "flash-attn-4" not in importlib.metadata.packages_distributions().get("flash_attn", [])
    flash_attn_compat.uninstall_as_flash_attn()
    assert "flash_attn" not in importlib.metadata.packages_distributions()


@pytest.mark.usefixtures("clean_flash_attn")
def test_a_real_flash_attn_is_never_shadowed(tmp_path, monkeypatch) -> None:
    real = tmp_path / "flash_attn"
    real.mkdir()
    (real / "__init__.py").write_text("__version__ = '2.7.4'\nREAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    status = fa_attn.install_as_flash_attn()
    assert status.provider == "flash-attn"
    assert status.origin == str(real / "__init__.py")
    assert "does not replace it" in status.message
    import flash_attn

    assert flash_attn.REAL is True


@pytest.mark.usefixtures("clean_flash_attn")
def test_a_flash_attn_installed_later_wins(tmp_path, monkeypatch) -> None:
    """The stand-in's finder sits behind the path finder: a real install found later takes over."""
    assert fa_attn.install_as_flash_attn().provider == "fa_attn"
    real = tmp_path / "flash_attn"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    import flash_attn

    assert getattr(flash_attn, "REAL", False) is True
    assert fa_attn.flash_attn_status().provider == "flash-attn"


def test_run_a_script_unchanged(tmp_path) -> None:
    """`python -m fa_attn.flash_attn_compat script.py`: flash-attn code, no edits."""
    script = tmp_path / "uses_flash_attn.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import torch
            from flash_attn import flash_attn_func
            q = torch.randn(1, 4, 2, 8)
            print("shape", tuple(flash_attn_func(q, q, q, causal=True).shape), sys.argv[1:])
            """
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "kernels"), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "fa_attn.flash_attn_compat", str(script), "--flag"],
        capture_output=True, text=True, env=env, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "shape (1, 4, 2, 8) ['--flag']" in done.stdout
    assert "gives fa_attn" in done.stderr
