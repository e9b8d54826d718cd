"""fa_attn's modules moved into runtime/, standin/ and verify/; the paths users, docs and scripts name
(`import fa_attn.decision`, `from fa_attn import fallback`, `python -m fa_attn.check`) keep working:
each old name is the very module at its new path (one object: a monkeypatch through either name is
seen through the other), and the documented `python -m` entry points run as before."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import fa_attn
import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "kernels" / "fa_attn"

# Every module that sat at fa_attn's top before the move (commit 205e97b), under its old name.
OLD_TOP_LEVEL = [
    "_constant",
    "_standin",
    "activations",
    "all_wheel",
    "bert_padding",
    "block",
    "call_cache",
    "check",
    "cross_entropy",
    "decision",
    "dispatch",
    "embedding",
    "fallback",
    "flash_attn_compat",
    "flash_attn_ext",
    "flash_attn_privates",
    "hf",
    "inputs",
    "interface",
    "kvcache",
    "loader",
    "mha",
    "norms",
    "ops",
    "packed",
    "preload",
    "reasons",
    "rotary",
    "schema",
    "sdpa",
    "selfcheck",
    "tensor_parallel",
    "triton_attention",
    "versions",
    "ownfiles",
    "_env",
    "_version",
]


@pytest.mark.parametrize("old", sorted(OLD_TOP_LEVEL))
def test_every_old_module_path_is_the_module_at_its_new_path(old: str) -> None:
    module = importlib.import_module(f"fa_attn.{old}")
    new = module.__name__
    assert new == f"fa_attn.{old}" or new == f"fa_attn.{fa_attn._old_paths.MOVED[old]}"
    assert importlib.import_module(new) is module
    assert sys.modules[f"fa_attn.{old}"] is module
    assert getattr(fa_attn, old) is module  # `from fa_attn import <old>` gives the same object
    assert module.__spec__ is not None
    assert module.__spec__.name == new  # the module still says where it lives
    assert Path(module.__file__).is_file()


def test_every_old_name_is_an_attribute_of_the_package_without_importing_it() -> None:
    """`import fa_attn; fa_attn.decision.Call(...)` ran before the move (fa_attn's __init__ imported
    those modules); in a fresh interpreter, with nothing imported by its old name first, it still does."""
    probe = (
        "import fa_attn, importlib, sys\n"
        f"names = {sorted(OLD_TOP_LEVEL)!r}\n"
        "wrong = [n for n in names if getattr(fa_attn, n) is not importlib.import_module('fa_attn.' + n)]\n"
        "print(wrong, hasattr(fa_attn, 'no_such_module'))\n"
    )
    done = _run("-c", probe)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] False"


def test_the_table_names_only_moved_modules_and_real_targets() -> None:
    """An old name is in the table only when no file has it any more (a real file always wins),
    and each target is a file under fa_attn/."""
    for old, new in fa_attn._old_paths.MOVED.items():
        assert not (PACKAGE / f"{old}.py").exists(), old
        assert (PACKAGE / (new.replace(".", "/") + ".py")).is_file(), new
    moved = {old for old in OLD_TOP_LEVEL if not (PACKAGE / f"{old}.py").exists()}
    assert moved == set(fa_attn._old_paths.MOVED)


def test_a_patch_through_the_old_name_is_seen_at_the_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from fa_attn.runtime import dispatch

    monkeypatch.setattr("fa_attn.dispatch.driver_version", lambda: "999.1")
    assert dispatch.driver_version() == "999.1"


def test_an_unknown_name_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError, match=r"fa_attn\.no_such_module"):
        importlib.import_module("fa_attn.no_such_module")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "kernels"), "FA_CHECK_RECORDS": "/nonexistent-fa-check"}
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=env, cwd=REPO, check=False
    )


def test_python_m_fa_attn_check_still_runs() -> None:
    """docs/checking.md: `python -m fa_attn.check` on a machine with only the wheel."""
    done = _run("-m", "fa_attn.check", "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
    assert "Traceback" not in done.stderr
    assert "RuntimeWarning" not in done.stderr  # runpy's warning when a module runs twice


def test_python_m_fa_attn_flash_attn_compat_still_runs(tmp_path: Path) -> None:
    """docs/using.md: `python -m fa_attn.flash_attn_compat script.py` runs flash-attn code unedited."""
    script = tmp_path / "uses_flash_attn.py"
    script.write_text(
        "import sys\nfrom flash_attn import flash_attn_func\n"
        "print(flash_attn_func.__module__, sys.argv[1:])\n"
    )
    done = _run("-m", "fa_attn.flash_attn_compat", str(script), "one", "two")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fa_attn.runtime.interface", "['one',", "'two']"]
