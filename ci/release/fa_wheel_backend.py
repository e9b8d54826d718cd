"""PEP 517 backend through which cibuildwheel builds one fa-attn wheel: `fa build --shard K/N` is the
build step, and the wheel returned is the one of variant FA_VARIANT.

cibuildwheel takes exactly one wheel from each build, while `fa build --shard K/N` makes all the
wheels of a shard at once (they share their kernel programs). So the release job runs cibuildwheel
once per wheel of its shard: every run builds the whole shard into FA_OUT, and with FA_CACHE and
FA_OUT kept between runs (mounted from the runner) only the first run compiles anything.

Environment (set by the release workflow's CIBW_ENVIRONMENT and CIBW_ENVIRONMENT_PASS_LINUX):
  FA_MATRIX   the matrix file, relative to the repository root (or absolute)
  FA_SHARD    K/N, as for `fa build --shard`
  FA_VARIANT  the variant label of the wheel to return, e.g. cu12torch2.7
  FA_OUT      fa build's output folder (wheels, index, logs/)
  FA_PLATFORM optional: the CPU whose wheels to build, as for `fa build --platform` (its shards)
fa itself must be importable by this interpreter (the workflow's before-build: pip install {project});
cibuildwheel runs pip with --no-build-isolation so that it is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.utils import parse_wheel_filename

PROJECT = Path(__file__).resolve().parents[2]
ENV_KEYS = ("FA_MATRIX", "FA_SHARD", "FA_VARIANT", "FA_OUT")


class BackendError(RuntimeError):
    """A missing setting or a shard without the requested wheel; the message names the fix."""


def _settings() -> dict[str, str]:
    missing = [key for key in ENV_KEYS if not os.environ.get(key)]
    if missing:
        raise BackendError(
            f"{', '.join(missing)} not set; this backend builds one wheel of `fa build --shard K/N`\n"
            "  fix: set FA_MATRIX, FA_SHARD, FA_VARIANT and FA_OUT (release.yml's CIBW_ENVIRONMENT does)"
        )
    return {key: os.environ[key] for key in ENV_KEYS}


def variant_of(wheel_file: str) -> str:
    """ "fa_attn-0.1.0+cu12torch2.7-py3-none-manylinux_2_28_x86_64.whl" -> "cu12torch2.7"; "" for the
    universal wheel (py3-none-any); "all" for the all-wheel, the one without a label tagged for a CPU."""
    local = parse_wheel_filename(wheel_file)[1].local
    if local:
        return local
    return "" if wheel_file.endswith("-any.whl") else "all"


def build_shard(matrix: Path, shard: str, out: Path, platform: str | None = None) -> list[str]:
    """Runs `fa build` for the shard (stderr shows its errors) and returns the wheel files it wrote."""
    command = [sys.executable, "-m", "buildtool.cli", "build", "--matrix", str(matrix), "--shard", shard]
    if platform:
        command += ["--platform", platform]
    command += ["--out", str(out), "--json"]
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    proc = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise BackendError(f"fa build exited with {proc.returncode}; its message is above")
    summary = json.loads(proc.stdout)
    return [wheel["file"] for wheel in summary["wheels"]]


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, object] | None = None,
    metadata_directory: str | None = None,
) -> str:
    settings = _settings()
    variant, shard = settings["FA_VARIANT"], settings["FA_SHARD"]
    out = Path(settings["FA_OUT"])
    files = build_shard(PROJECT / settings["FA_MATRIX"], shard, out, os.environ.get("FA_PLATFORM") or None)
    chosen = [f for f in files if variant_of(f) == variant]
    if len(chosen) != 1:
        built = ", ".join(variant_of(f) or "(universal)" for f in files) or "none"
        raise BackendError(
            f"FA_VARIANT={variant}: `fa build --shard {shard}` built {len(chosen)} wheels of that variant "
            f"(it built: {built})\n"
            f"  fix: take FA_VARIANT from `fa build --matrix {settings['FA_MATRIX']} --shard {shard} "
            "--dry-run --json` (.wheels[].variant with a cuda_major)"
        )
    (name,) = chosen
    shutil.copy2(out / name, Path(wheel_directory) / name)
    print(f"fa_wheel_backend: {name}", file=sys.stderr)
    return name


def build_sdist(sdist_directory: str, config_settings: dict[str, object] | None = None) -> str:
    raise BackendError("fa-attn has no sdist: its wheels are built from matrix.yaml by `fa build`")
