"""`fa doctor` answers first, at 80 columns: the verdict, the wheel and its pip line, and what runs for
fp16 and for bf16 on each GPU in the first screen; the other wheels as a count unless --all; no Fixes
section when the verdict is ok; wrapped lines indented under their item; and no fix that is circular,
names a wheel the index does not have, or points at a setting already made.

Run as a user runs it (the CLI in-process, typer's runner, COLUMNS=80), on machines of the test corpus
and on wheel folders written here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from buildtool.cli import app
from buildtool.compat.env import env_from_json
from buildtool.compat.fit import TagIndex, supported_tags, wheel_reasons
from buildtool.core.runtime import schema
from tests.select.fixture_index import kernel_entry, universal_entry

REPO = Path(__file__).resolve().parents[2]
ENVS = REPO / "tests" / "select" / "envs"
SCREEN = 24  # lines of a first screen

runner = CliRunner()


def env_file(tmp_path: Path, case: str, **change: Any) -> Path:
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps({**json.loads((ENVS / f"{case}.json").read_text())["env"], **change}))
    return path


def doctor(*args: str) -> tuple[int, str]:
    done = runner.invoke(app, ["doctor", *args], env={"COLUMNS": "80"})
    return done.exit_code, done.stdout


def all_text(out: str) -> str:
    return " ".join(out.split())


@pytest.mark.parametrize("case", ["a100-ngc-24.10", "t4-colab-bf16", "mixed-a100-t4", "gb300-sm103"])
def test_the_first_screen_holds_the_answer(tmp_path: Path, index_dir: Path, case: str) -> None:
    code, out = doctor("--env", str(env_file(tmp_path, case)), "--wheels", str(index_dir))
    assert code == 0, out
    screen = out.splitlines()[:SCREEN]
    assert screen[0].startswith("verdict: ok")
    assert screen[1].startswith("wheel: ")
    assert screen[2].startswith("pip install --index-url ")
    gpus = json.loads((ENVS / f"{case}.json").read_text())["env"]["gpus"]
    first = "\n".join(screen)
    for i, gpu in enumerate(gpus):
        assert f"GPU {i} {gpu['name']} (sm {gpu['sm']})" in first
    assert first.count("fp16") >= 1
    assert first.count("bf16") >= 1
    # ok: no Fixes section, and the wheels that do not fit are a count, not a list
    assert "\nFixes" not in out
    assert "fit here" in out
    assert "torch-version-mismatch" not in out
    # 80 columns, but for what is pasted or names a path (kept whole)
    assert all(len(line) <= 80 for line in out.splitlines() if str(index_dir) not in line)


def test_wrapped_lines_are_indented_under_their_item(tmp_path: Path, index_dir: Path) -> None:
    """Every line that starts at column 0 begins an item; a wrapped line never does."""
    env = str(env_file(tmp_path, "p100-torch113"))
    _code, out = doctor("--env", env, "--wheels", str(index_dir), "--all")
    starts = ("verdict:", "GPU ", "No GPU", "because:", "why this wheel:", "wheel:", "pip install", "(the")
    headings = ("Machine", "Wheels in", "Fixes", "With uv", "The stack", "uv pip", "pyproject.toml")
    for line in out.splitlines():
        if line and not line[0].isspace():
            assert line.startswith(starts + headings), line
    assert "\nFixes" in out  # --all and the verdict is not ok: each wheel reason's fix once


def test_no_wheel_and_the_universal_wheel_never_send_you_to_fa_install(
    tmp_path: Path, index_dir: Path
) -> None:
    """`binding-unavailable` on the universal wheel that fa install picked does not say `fa install`, nor
    does any fix when fa install picks nothing or the universal wheel."""
    for case in ("centos7-glibc217", "rtx4090-windows", "p100-torch113", "python38"):
        _code, out = doctor("--env", str(env_file(tmp_path, case)), "--wheels", str(index_dir), "--json")
        report = json.loads(out)
        assert report["selected"] in (None, universal_entry()["file"]), case
        fixes = [r["fix"] for r in report["because"]]
        fixes += [r["fix"] for g in report["gpus"] for d in g["dtypes"].values() for r in d["reasons"]]
        assert fixes, case
        assert [f for f in fixes if "fa install` picks" in f or "(`fa install`)" in f] == [], case
    _code, out = doctor("--env", str(env_file(tmp_path, "centos7-glibc217")), "--wheels", str(index_dir))
    assert "binding-unavailable" in out
    assert "no kernel wheel in this index fits this machine" in all_text(out)


def test_windows_is_never_sent_to_a_win_amd64_wheel_the_index_does_not_have(
    tmp_path: Path, index_dir: Path, index_data: dict
) -> None:
    """torch 2.5 on Windows: the index's win_amd64 wheels serve torch 2.10 and newer, so the fix says
    that; an index without any win_amd64 wheel says it has none."""
    env = str(env_file(tmp_path, "rtx4090-windows"))
    report = json.loads(doctor("--env", env, "--wheels", str(index_dir), "--json")[1])
    (fix,) = [r["fix"] for r in report["because"] if r["code"] == "unsupported-platform"]
    assert "win_amd64 wheels serve torch 2.10 or newer" in fix
    assert "use a win_amd64 wheel" not in fix
    linux_only = tmp_path / "linux-only"
    linux_only.mkdir()
    data = {**index_data, "wheels": [w for w in index_data["wheels"] if "win_amd64" not in w["file"]]}
    (linux_only / "index.json").write_text(json.dumps(data))
    report = json.loads(doctor("--env", env, "--wheels", str(linux_only), "--json")[1])
    fixes = [r["fix"] for r in report["because"]]
    assert any("this index has no win_amd64 wheel" in f for f in fixes)
    assert not any("win_amd64 wheel (" in f for f in fixes)


def test_an_x86_64_folder_read_on_a_gh200_names_the_builds_platform_option(
    tmp_path: Path, index_data: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's first command builds with `--platform x86_64`: on a GH200 the cause is that option, not a
    matrix without aarch64 (the repo's matrix.yaml lists it)."""
    project = tmp_path / "project"
    (project / "wheels").mkdir(parents=True)
    shutil.copy(REPO / "matrix.yaml", project / "matrix.yaml")
    x86 = [w for w in index_data["wheels"] if w.get("platform") in ("x86_64", None)]
    (project / "wheels" / "index.json").write_text(json.dumps({**index_data, "wheels": x86}))
    monkeypatch.chdir(project)
    env = str(env_file(tmp_path, "gh200-ngc-aarch64"))
    report = json.loads(doctor("--env", env, "--json")[1])
    assert report["selected"] == universal_entry()["file"]
    (fix,) = [r["fix"] for r in report["because"] if r["code"] == "unsupported-platform"]
    assert "built with `fa build --platform x86_64`" in fix
    assert "fa build --platform aarch64" in fix
    assert "add" not in fix
    # A matrix without aarch64: then adding it is the fix.
    (project / "matrix.yaml").write_text(
        (REPO / "matrix.yaml")
        .read_text()
        .replace('platforms: ["x86_64", "aarch64"]', 'platforms: ["x86_64"]')
    )
    report = json.loads(doctor("--env", env, "--json")[1])
    (fix,) = [r["fix"] for r in report["because"] if r["code"] == "unsupported-platform"]
    assert 'add "aarch64" to platforms in matrix.yaml' in fix


def test_a_local_manylinux_2_34_build_on_glibc_2_31_points_at_the_release_wheels() -> None:
    entry = kernel_entry(12, "2.5", False)
    tag = "manylinux_2_34_x86_64"
    local = schema.read_index(
        {
            "schema": 1,
            "package": "fa-attn",
            "wheels": [
                {**entry, "file": entry["file"].replace(entry["platform_tag"], tag), "platform_tag": tag}
            ],
        }
    )[0]
    env = env_from_json(
        {**json.loads((ENVS / "aws-a10g-pypi-torch.json").read_text())["env"], "glibc": "2.31"}
    )
    (reason,) = [
        r for r in wheel_reasons(local, env, TagIndex.of(supported_tags(env))) if r.code == "glibc-too-old"
    ]
    assert "the release's manylinux_2_28 wheels fit glibc 2.31" in reason.fix
    assert "needs the glibc it was built on (2.34)" in reason.fix
    assert "use a system with glibc" not in reason.fix
    # Below the release's floor too: then only a newer system helps.
    old = env_from_json(
        {**json.loads((ENVS / "aws-a10g-pypi-torch.json").read_text())["env"], "glibc": "2.17"}
    )
    (reason,) = [
        r for r in wheel_reasons(local, old, TagIndex.of(supported_tags(old))) if r.code == "glibc-too-old"
    ]
    assert reason.fix.startswith("use a system with glibc >= 2.34")


def test_no_gpu_machine_answers_both_dtypes_once(tmp_path: Path, index_dir: Path) -> None:
    _code, out = doctor("--env", str(env_file(tmp_path, "cpu-only-torch")), "--wheels", str(index_dir))
    assert "fp16, bf16: fallback to torch SDPA" in out
    assert universal_entry()["file"] not in out


def test_eight_alike_gpus_share_one_answer(tmp_path: Path, index_dir: Path) -> None:
    """An 8-GPU node answers once for the eight (a row each pushed the answer off the first screen)."""
    h100 = {"name": "NVIDIA H100 80GB HBM3", "sm": "9.0", "memory_mib": 81559}
    env = env_file(tmp_path, "h100-driver535-torch27-cu128", gpus=[h100] * 8, driver={"version": "580.65.06"})
    _code, out = doctor("--env", str(env), "--wheels", str(index_dir))
    screen = out.splitlines()[:SCREEN]
    assert any(line.startswith("GPUs 0-7 NVIDIA H100 80GB HBM3 (sm 9.0)") for line in screen), out
    assert "GPU 1 " not in out


@pytest.mark.parametrize("case", sorted(p.stem for p in ENVS.glob("*.json")))
def test_every_machine_of_the_corpus_reads_at_80_columns(tmp_path: Path, index_dir: Path, case: str) -> None:
    """Each line of doctor's report fits 80 columns (a wrapped line is indented under its item) for every
    machine of the corpus; only a line that is one word, or names a path pasted whole, may be longer. The
    ok-jit verdict's line was 87 columns, unwrapped."""
    _, out = doctor("--env", str(env_file(tmp_path, case)), "--wheels", str(index_dir))
    lines = out.splitlines()
    assert lines[0].startswith("verdict: ")
    assert [
        line for line in lines if len(line) > 80 and str(index_dir) not in line and " " in line.strip()
    ] == []


def test_readme_describes_the_report_doctor_prints(tmp_path: Path, index_dir: Path) -> None:
    """README said doctor gives 'for every other wheel the reasons it does not fit': it gives their count,
    and --all lists them. README's paragraph on doctor must say what the report holds: the count and
    --all."""
    _, out = doctor("--env", str(env_file(tmp_path, "a100-ngc-24.10")), "--wheels", str(index_dir))
    assert "torch-version-mismatch" not in out  # no other wheel's reasons without --all
    readme = " ".join((REPO / "README.md").read_text().split())
    paragraph = readme[readme.index("`fa doctor` reads `wheels/`") :].split(" On a machine")[0]
    assert "for every other wheel the reasons" not in paragraph
    assert "--all" in paragraph, paragraph
    first = readme[readme.index("The first builds the release wheels") :].split(".")[0]
    assert "why the others don't" not in first or "--all" in first, first
