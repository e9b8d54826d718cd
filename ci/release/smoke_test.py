"""CPU smoke test of one fa-attn wheel, as the release workflow runs it on every wheel it publishes.

    python smoke_test.py WHEEL [--torch M.m] [--torch-index URL]

In the running interpreter's environment (cibuildwheel's test venv): installs the CPU build of the
wheel's torch minor (or --torch) from PyTorch's CPU index unless that minor is already installed (an
explicit install: fa-attn itself requires nothing), installs the wheel with --no-deps, then in a fresh
interpreter checks that (a stable-ABI wheel: with each minor of its manifest's `torch_tested` in turn)
  - fa_attn imports from the installed wheel (not a source tree), with the wheel's version and variant;
  - the binding loads and registers its CUDA kernels wherever the running torch is the one it was built
    for (its torch minor and C++ ABI: a CPU torch of an older minor may have the other ABI, said so);
  - an attention call on CPU tensors runs the SDPA fallback with reason `device-not-cuda`, and its
    output matches torch SDPA.
Exit 0 with one line "smoke ok: ...", or 1 with what failed. Needs only the standard library and, for
the check, torch.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any, cast

CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
MANIFEST = "fa_attn/manifest.json"


class SmokeFailure(RuntimeError):
    pass


def wheel_manifest(wheel: Path) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as zf:
        manifest: dict[str, Any] = json.loads(zf.read(MANIFEST))
    return manifest


def wheel_version(wheel: Path) -> str:
    """The version field of a wheel file name: "fa_attn-0.1.0+cu12torch2.7-py3-none-any.whl" ->
    "0.1.0+cu12torch2.7" (no `packaging` in a bare test venv)."""
    return wheel.name.split("-")[1]


def torch_minor(version: str) -> str:
    """fa's own reading of a torch version (kernels/fa_attn/versions.py, loaded from this checkout:
    fa_attn itself is not installed yet when this runs)."""
    path = Path(__file__).resolve().parents[2] / "kernels" / "fa_attn" / "versions.py"
    spec = importlib.util.spec_from_file_location("_fa_versions", path)
    assert spec is not None
    assert spec.loader is not None
    versions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(versions)
    return str(versions.torch_minor(version))


def torch_minors(manifest: dict[str, Any]) -> list[str]:
    """The torch minors to test a wheel with: every one a stable-ABI wheel was built to serve (its
    `torch_tested`, which the manifest promises were tested), else the one its binding is built for;
    the all-wheel: each of its bindings' (their minors, and every minor of the stable one)."""
    if manifest.get("bindings"):
        minors = [m for b in manifest["bindings"] for m in (b["torch_tested"] or [b["torch"]])]
        return list(dict.fromkeys(minors))
    if manifest.get("binding_form") == "stable" and manifest.get("torch_tested"):
        return list(manifest["torch_tested"])
    return [manifest["torch"]] if manifest.get("torch") else []


def installed_torch() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", "install", *args]
    print("+ " + " ".join(command), flush=True)
    subprocess.run(command, check=True)


def ensure_torch(minor: str, index: str) -> None:
    have = installed_torch()
    if have is not None and torch_minor(have) == minor:
        print(f"torch {have} is installed: kept", flush=True)
        return
    pip(f"torch=={minor}.*", "--index-url", index)


def check(wheel: Path) -> str:
    """The checks after installation; run in a fresh interpreter by main()."""
    import fa_attn
    import torch
    from fa_attn.runtime import loader

    where = Path(fa_attn.__file__).resolve()
    if "site-packages" not in where.parts:
        raise SmokeFailure(f"fa_attn was imported from {where}, not from the installed wheel")
    version = importlib.metadata.version("fa-attn")
    if version != wheel_version(wheel):
        raise SmokeFailure(f"installed fa-attn is {version}, the wheel is {wheel_version(wheel)}")
    manifest = loader.manifest()
    if manifest.info.variant != wheel_manifest(wheel)["variant"]:
        raise SmokeFailure(f"installed manifest has variant {manifest.info.variant!r}, not the wheel's")

    manifest = loader.as_this_torch(manifest)  # the all-wheel: its binding for this torch
    problem = loader.static_binding_problem(manifest)
    if problem is None:
        failed = loader.load_binding()
        if failed is not None:
            raise SmokeFailure(f"the binding does not load: [{failed.code}] {failed.message}")
        binding = "binding loaded"
    elif manifest.info.binding and problem.code == "cxx11abi-mismatch":
        binding = f"binding not loaded: {problem.message}"  # the CPU torch of this minor has the other ABI
    elif not manifest.info.binding and problem.code == "binding-unavailable":
        binding = "no binding (universal wheel)"
    else:
        raise SmokeFailure(f"the binding cannot serve this torch: [{problem.code}] {problem.message}")

    q, k, v = (torch.randn(2, 33, 4, 64) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fa_attn.FaFallbackWarning)
        out = cast(torch.Tensor, fa_attn.flash_attn_func(q, k, v, causal=True))
    dispatch = fa_attn.last_dispatch()
    codes = [reason.code for reason in dispatch.reasons] if dispatch else []
    if dispatch is None or dispatch.path != "fallback" or codes != ["device-not-cuda"]:
        raise SmokeFailure(f"a CPU call should fall back with device-not-cuda; it ran {dispatch}")
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    if not torch.allclose(out, ref, atol=1e-5):
        raise SmokeFailure(f"the fallback's output differs from SDPA by {(out - ref).abs().max().item():.3g}")
    return (
        f"smoke ok: {wheel.name}: fa-attn {version} on torch {torch.__version__}; {binding}; "
        "a CPU call fell back (device-not-cuda) and matched SDPA"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("wheel", type=Path)
    parser.add_argument(
        "--torch", help="torch minor to test with (default: the wheel's; needed for the universal wheel)"
    )
    parser.add_argument(
        "--torch-index", default=CPU_TORCH_INDEX, help="where the CPU build of torch comes from"
    )
    parser.add_argument("--check-installed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    wheel: Path = args.wheel.resolve()
    try:
        if args.check_installed:
            print(check(wheel))
            return 0
        minors = [args.torch] if args.torch else torch_minors(wheel_manifest(wheel))
        if not minors:
            raise SmokeFailure(
                f"{wheel.name} is built for no torch minor\n  fix: pass --torch M.m (e.g. 2.8)"
            )
        pip("--no-deps", str(wheel))
        env = {key: value for key, value in os.environ.items() if key != "FA_STRICT"}
        for minor in minors:
            ensure_torch(minor, args.torch_index)
            # A fresh interpreter, started outside any source tree, sees only what is installed.
            with tempfile.TemporaryDirectory() as cwd:
                command = [sys.executable, str(Path(__file__).resolve()), "--check-installed", str(wheel)]
                failed = subprocess.run(command, cwd=cwd, env=env, check=False).returncode
            if failed:
                return failed
        return 0
    except (SmokeFailure, subprocess.CalledProcessError, OSError, KeyError, zipfile.BadZipFile) as e:
        print(f"smoke FAILED: {wheel.name}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
