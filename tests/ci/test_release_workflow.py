"""The release workflow rendered from matrix.yaml (`fa ci render`): the checked-in file is current,
`--check` names the stale file and the fix, the YAML has one cibuildwheel job per shard plus publish,
and cibuildwheel itself reads each job's configuration as meant (no containers: it only parses)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from buildtool.builder.matrix import load_matrix, parse_matrix
from buildtool.builder.platform_tag import TORCH_LIBS
from buildtool.cli import app
from buildtool.release import workflow
from buildtool.release.workflow import majors_built_for

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
BUILD_STEP = "Build, repair and smoke-test each wheel of the shard (one cibuildwheel run per wheel)"
runner = CliRunner()

SMALL = """\
version: "0.1.0"
torch: ["2.8", "2.9"]
cuda: [12]
python: ["3.12"]
"""


def render(matrix_text: str) -> dict:
    matrix = parse_matrix(matrix_text, "matrix.yaml")
    return yaml.safe_load(workflow.render(workflow.from_matrix(matrix, Path("matrix.yaml"))))


def repo_workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def build_jobs(workflow: dict) -> dict[str, dict]:
    return {name: job for name, job in workflow["jobs"].items() if name.startswith("build-")}


def build_step_env(job: dict) -> dict[str, str]:
    (step,) = [s for s in job["steps"] if s.get("name") == BUILD_STEP]
    return step["env"]


def test_checked_in_workflow_is_what_matrix_yaml_renders():
    result = runner.invoke(
        app, ["ci", "render", "--check", "--matrix", "matrix.yaml", "--out", str(WORKFLOW)]
    )
    assert result.exit_code == 0, result.output


def test_check_names_the_stale_file_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrix.yaml").write_text(SMALL)
    out = tmp_path / "release.yml"
    missing = runner.invoke(app, ["ci", "render", "--check", "--out", str(out)])
    assert missing.exit_code == 1
    assert f"{out} does not exist" in missing.output
    assert "fix: run `fa ci render --out" in missing.output

    assert runner.invoke(app, ["ci", "render", "--out", str(out)]).exit_code == 0
    assert runner.invoke(app, ["ci", "render", "--check", "--out", str(out)]).exit_code == 0

    (tmp_path / "matrix.yaml").write_text(SMALL.replace('"2.9"]', '"2.9", "2.10"]'))  # a new torch minor
    stale = runner.invoke(app, ["ci", "render", "--check", "--out", str(out)])
    assert stale.exit_code == 1
    assert f"{out} is out of date" in stale.output
    assert "--torch 2.10" in stale.output
    assert f"fix: run `fa ci render --out {out}` and commit {out}" in stale.output


def test_bad_matrix_exits_2_naming_the_field(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrix.yaml").write_text(SMALL + "pyton: []\n")
    result = runner.invoke(app, ["ci", "render", "--check"])
    assert result.exit_code == 2
    assert "pyton: unknown key" in result.output
    (tmp_path / "matrix.yaml").write_text(SMALL)
    absolute = runner.invoke(app, ["ci", "render", "--matrix", str(tmp_path / "matrix.yaml")])
    assert absolute.exit_code == 2
    assert "relative --matrix" in absolute.output


def test_one_build_job_per_cpu_and_cuda_major_then_publish():
    matrix = load_matrix(REPO / "matrix.yaml")
    workflow = repo_workflow()
    jobs = build_jobs(workflow)
    expected = {cpu: majors_built_for(matrix, cpu) for cpu in matrix.platforms}
    assert expected == {"x86_64": [11, 12, 13], "aarch64": [12, 13]}  # no cu11 torch for Arm servers
    assert sorted(jobs) == sorted(
        f"build-{cpu}-{k}" for cpu, m in expected.items() for k in range(1, len(m) + 1)
    )
    assert set(workflow["jobs"]) == {*jobs, "windows", "publish", "pages", "pypi"}
    assert workflow["jobs"]["publish"]["needs"] == [*jobs, "windows"]
    assert workflow["jobs"]["pages"]["needs"] == "publish"
    assert workflow[True] == {
        "push": {"tags": ["v*"]},
        "workflow_dispatch": None,
    }  # YAML 1.1 reads `on` as true
    runners = {"x86_64": "ubuntu-24.04", "aarch64": "ubuntu-24.04-arm"}
    for name, job in jobs.items():
        _, cpu, k = name.split("-")
        n = len(expected[cpu])
        assert job["runs-on"] == runners[cpu]
        env = build_step_env(job)
        assert env["CIBW_BUILD"] == f"cp312-manylinux_{cpu}"
        assert env["CIBW_ARCHS"] == cpu
        assert env[f"CIBW_MANYLINUX_{cpu.upper()}_IMAGE"] == "manylinux_2_28"
        assert {f"FA_SHARD={k}/{n}", f"FA_PLATFORM={cpu}"} <= set(env["CIBW_ENVIRONMENT"].split())
        plan = next(s for s in job["steps"] if s.get("name", "").startswith("Plan"))
        assert f"--platform {cpu} --shard {k}/{n} --dry-run --json" in plan["run"]
        universal = [s for s in job["steps"] if "universal" in s.get("name", "")]
        assert len(universal) == (name == "build-x86_64-1")  # shard 1 of the first CPU
        assert not [s for s in job["steps"] if s.get("uses", "").startswith("actions/cache")]  # poisoning


def test_repair_excludes_exactly_torchs_libraries():
    for job in build_jobs(repo_workflow()).values():
        words = build_step_env(job)["CIBW_REPAIR_WHEEL_COMMAND_LINUX"].split()
        assert words[:2] == ["auditwheel", "repair"]
        assert words[-3:] == ["-w", "{dest_dir}", "{wheel}"]
        excluded = {words[i + 1] for i, w in enumerate(words) if w == "--exclude"}
        assert excluded == set(TORCH_LIBS)


def test_shards_follow_the_matrix():
    assert sorted(build_jobs(render(SMALL))) == ["build-x86_64-1"]
    assert sorted(build_jobs(render(SMALL + 'platforms: ["x86_64", "aarch64"]\n'))) == [
        "build-aarch64-1",
        "build-x86_64-1",
    ]
    assert sorted(build_jobs(render(SMALL.replace("cuda: [12]", "cuda: [11, 12]")))) == [
        "build-x86_64-1",
        "build-x86_64-2",
    ]


def test_publish_merges_indexes_and_publishes_pep503():
    steps = repo_workflow()["jobs"]["publish"]["steps"]
    script = "\n".join(s.get("run", "") for s in steps)
    assert "fa index wheels" in script
    assert "diff planned.txt built.txt" in script
    assert any(s.get("uses", "").startswith("actions/upload-pages-artifact") for s in steps)
    assert "gh release upload" in script


def test_publish_ships_the_index_page_with_the_wheels():
    """fa index writes wheels/index.html; the Pages site is wheels/ and the release assets name it."""
    steps = repo_workflow()["jobs"]["publish"]["steps"]
    script = "\n".join(s.get("run", "") for s in steps)
    pages = [s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact")]
    assert [s["with"]["path"] for s in pages] == ["wheels/"]
    assert "wheels/index.html" in script


def test_the_release_asset_carries_every_variant_index_and_no_wheel(tmp_path):
    """The publish job's tar line, run on a tree `fa index` wrote: every index `fa doctor` may name."""
    import tarfile

    from buildtool.builder import index
    from tests.select.fixture_index import kernel_entry, universal_entry
    from tests.select.tiny_wheels import build_wheel

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for entry in (kernel_entry(12, "2.9", True), kernel_entry(12, "2.10", None), universal_entry()):
        build_wheel(wheels, entry)
    index.write_index(wheels)
    steps = repo_workflow()["jobs"]["publish"]["steps"]
    (line,) = [
        ln.strip()
        for s in steps
        for ln in s.get("run", "").splitlines()
        if "simple-index.tar.gz" in ln and "tar " in ln
    ]
    subprocess.run(["bash", "-c", line], cwd=tmp_path, check=True)
    with tarfile.open(tmp_path / "simple-index.tar.gz") as tar:
        names = {n.removeprefix("./") for n in tar.getnames()}
    pages = {n for n in names if n.endswith("fa-attn/index.html")}
    assert pages == {f"{p}simple/fa-attn/index.html" for p in ("", "cu12/", "cu12-torch2.9/", "universal/")}
    assert "index.json" in names
    assert "index.html" in names  # the page, beside the indexes
    assert not [n for n in names if n.endswith(".whl")]


needs_check_jsonschema = pytest.mark.skipif(
    importlib.util.find_spec("check_jsonschema") is None,
    reason="check-jsonschema is not installed (pip install -e '.[test]' installs it)",
)


@needs_check_jsonschema
def test_release_yml_is_a_valid_github_workflow():
    """GitHub's workflow schema (SchemaStore's, vendored in check-jsonschema: no network)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
            str(WORKFLOW),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_windows_job_repacks_the_x86_64_stable_wheels_with_an_msvc_binding():
    jobs = repo_workflow()["jobs"]
    windows = jobs["windows"]
    x86 = [name for name in build_jobs(repo_workflow()) if name.startswith("build-x86_64-")]
    script = "\n".join(s.get("run", "") for s in windows["steps"])
    assert windows["runs-on"] == "windows-latest"
    assert windows["needs"] == x86
    assert any(s.get("uses", "").startswith("ilammy/msvc-dev-cmd") for s in windows["steps"])
    assert "ci/release/msvc_binding.py --floor 2.10" in script
    assert "ci/release/windows_wheel.py --binding fa_attn_ops.dll" in script
    assert "windows" in jobs["publish"]["needs"]


def test_no_stable_abi_means_no_windows_job():
    assert "windows" not in render(SMALL)["jobs"]


def test_the_msvc_command_builds_the_stable_forms_sources(tmp_path):
    sys.path.insert(0, str(REPO / "ci" / "release"))
    try:
        import msvc_binding
    finally:
        sys.path.pop(0)
    from buildtool.builder.binding import sources
    from buildtool.core import binding_forms

    kernels = REPO / "kernels"
    command = msvc_binding.cl_command(kernels, tmp_path / "torch", "2.10", tmp_path / "fa_attn_ops.dll")
    cpp = {str(p) for p in sources(kernels, binding_forms.STABLE) if p.suffix == ".cpp"}
    assert cpp == {a for a in command if a.endswith(".cpp")}
    assert f"/DTORCH_TARGET_VERSION={binding_forms.target_version('2.10')}" in command
    assert ("/EHs" in command, "/EHsc" in command) == (True, False)  # exceptions cross extern "C"


def test_the_packing_script_makes_windows_wheels_of_the_stable_ones_only(tmp_path):
    import struct

    from tests.select.fixture_index import kernel_entry
    from tests.select.tiny_wheels import build_wheel

    shards = tmp_path / "shards"
    shards.mkdir()
    wheels = [build_wheel(shards, e) for e in (kernel_entry(12, "2.10", None), kernel_entry(12, "2.9", True))]
    dll = bytearray(0x100)
    dll[:2] = b"MZ"
    struct.pack_into("<I", dll, 0x3C, 0x80)
    dll[0x80:0x84] = b"PE\0\0"
    struct.pack_into("<H", dll, 0x84, 0x8664)
    (tmp_path / "fa_attn_ops.dll").write_bytes(bytes(dll))
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "ci" / "release" / "windows_wheel.py"),
            "--binding",
            str(tmp_path / "fa_attn_ops.dll"),
            "--out",
            str(tmp_path / "dist"),
            *map(str, wheels),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert [p.name for p in (tmp_path / "dist").glob("*.whl")] == [
        "fa_attn-0.1.0+cu12torch2.10plus-py3-none-win_amd64.whl"
    ]


# -- cibuildwheel reads the jobs' configuration ---------------------------------------------------------


def cibuildwheel_env(job: dict, runner_temp: Path) -> dict[str, str]:
    """The build step's environment as the runner gives it to cibuildwheel (GitHub fills ${{ }})."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    for key, value in build_step_env(job).items():
        env[key] = value.replace("${{ runner.temp }}", str(runner_temp))
    return env


needs_cibuildwheel = pytest.mark.skipif(
    importlib.util.find_spec("cibuildwheel") is None,
    reason="cibuildwheel is not installed (pip install -e '.[test]' installs it)",
)


@needs_cibuildwheel
def test_cibuildwheel_selects_exactly_the_jobs_build_identifier(tmp_path):
    for name, job in build_jobs(repo_workflow()).items():
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "cibuildwheel",
                "--print-build-identifiers",
                "--platform",
                "linux",
                "ci/release",
            ],
            cwd=REPO,
            env=cibuildwheel_env(job, tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        cpu = name.split("-")[1]
        assert proc.stdout.split() == [f"cp312-manylinux_{cpu}"], name


@needs_cibuildwheel
def test_cibuildwheel_parses_the_build_options_as_meant(tmp_path, monkeypatch):
    """--print-build-identifiers parses only the selection; the rest (frontend, environment, container
    engine, repair and test commands) is checked with cibuildwheel's own option reader."""
    from cibuildwheel.options import CommandLineArguments, compute_options

    monkeypatch.chdir(REPO)
    args = dataclasses.replace(
        CommandLineArguments.defaults(), platform="linux", package_dir=Path("ci/release")
    )
    for name, job in build_jobs(repo_workflow()).items():
        cpu = name.split("-")[1]
        env = cibuildwheel_env(job, tmp_path) | {"FA_VARIANT": "cu12torch2.9"}
        options = compute_options(platform="linux", command_line_arguments=args, env=env)
        build = options.build_options(f"cp312-manylinux_{cpu}")
        assert (build.build_frontend.name, build.build_frontend.args) == ("pip", ["--no-build-isolation"])
        assert build.before_build == "pip install {project}"
        container_env = build.environment.as_dictionary({"PATH": "/usr/bin"})
        assert container_env["FA_VARIANT"] == "cu12torch2.9"
        assert container_env["FA_CACHE"] == "/fa/cache"
        assert container_env["FA_MATRIX"] == "matrix.yaml"
        assert container_env["FA_OUT"] == "/fa/out"
        assert container_env["FA_PLATFORM"] == cpu
        assert build.container_engine.create_args == (f"--volume={tmp_path}/fa:/fa",)
        assert build.repair_command.startswith("auditwheel repair --exclude")
        assert build.test_command == 'python "{project}/ci/release/smoke_test.py" "{wheel}"'
        assert build.manylinux_images is not None
        assert f"manylinux_2_28_{cpu}" in build.manylinux_images[cpu]


def test_pypi_gets_the_all_wheels_and_the_universal_wheel_by_trusted_publishing():
    """Only the pypi job may mint an OIDC token for PyPI (and pages one for Pages); it publishes the
    wheels without a local label (PyPI refuses those): each CPU's all-wheel and the universal one."""
    workflow = repo_workflow()
    job = workflow["jobs"]["pypi"]
    assert job["needs"] == "publish"
    assert job["if"] == "startsWith(github.ref, 'refs/tags/')"
    assert job["permissions"] == {"id-token": "write"}
    assert job["environment"]["name"] == "pypi"
    writers = {name for name, j in workflow["jobs"].items() if j.get("permissions", {}).get("id-token")}
    assert writers == {"pypi", "pages", "publish"}  # publish: the provenance attestations' certificate
    publish = [st for st in job["steps"] if st.get("uses", "").startswith("pypa/gh-action-pypi-publish")]
    assert len(publish) == 1
    assert publish[0]["with"]["packages-dir"] == "pypi/"
    keep = next(st["run"] for st in job["steps"] if "run" in st)
    assert "*+*) ;;" in keep  # a per-variant wheel (+cu12torch2.7) stays on fa's index
    build = next(iter(build_jobs(workflow).values()))
    loop = next(st["run"] for st in build["steps"] if st.get("name", "").startswith("Build, repair"))
    assert '.variant == "all"' in loop  # the all-wheel goes through cibuildwheel like the others
