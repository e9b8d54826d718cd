"""The release workflow publishes the wheels users install, so it is held to what a supply chain needs:
zizmor (offline, every persona) and actionlint find nothing in it, for the repo's matrix and a small
one; every action is pinned to a commit from action_pins.json; no job restores a cache; no checkout
keeps credentials; the wheels and index.json get provenance attestations before they are uploaded.
`fa ci pins --refresh` is run against real git repositories on disk (its --from), never the network."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from buildtool.builder.matrix import parse_matrix
from buildtool.cli import app
from buildtool.release import pins, workflow

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
SMALL = 'version: "0.1.0"\ntorch: ["2.8", "2.9"]\ncuda: [12]\npython: ["3.12"]\nplatforms: ["x86_64", "aarch64"]\n'
runner = CliRunner()


def _steps(doc: dict) -> list[dict]:
    return [step for job in doc["jobs"].values() for step in job.get("steps", [])]


def _linter(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(found).exists():
        pytest.skip(f"{name} is not installed (pip install -e '.[test]' installs it)")
    return found


@pytest.fixture(params=["repo", "small"])
def rendered(request, tmp_path) -> Path:
    """A rendered release.yml in a folder of its own (zizmor and actionlint read .github/workflows)."""
    if request.param == "repo":
        text = WORKFLOW.read_text()
    else:
        text = workflow.render(workflow.from_matrix(parse_matrix(SMALL, "matrix.yaml"), Path("matrix.yaml")))
    path = tmp_path / ".github" / "workflows" / "release.yml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize("persona", ["regular", "pedantic", "auditor"])
def test_zizmor_finds_nothing(rendered, persona):
    done = subprocess.run(
        [_linter("zizmor"), "--offline", "--no-progress", f"--persona={persona}", str(rendered)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No findings to report" in done.stdout + done.stderr


def test_actionlint_finds_nothing(rendered):
    done = subprocess.run(
        [_linter("actionlint"), "-no-color", str(rendered)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=rendered.parents[2],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""


def test_every_action_is_pinned_to_a_commit_of_the_pins_file():
    doc = yaml.safe_load(WORKFLOW.read_text())
    used = [step["uses"] for step in _steps(doc) if "uses" in step]
    pinned = pins.load()
    assert used
    for ref in used:
        name, _, sha = ref.partition("@")
        assert re.fullmatch(r"[0-9a-f]{40}", sha), ref
        assert pinned[name].sha == sha
    assert {ref.partition("@")[0] for ref in used} == set(pinned)  # no stale pin
    for line in WORKFLOW.read_text().splitlines():  # the tag it came from, for people
        if "uses: " in line:
            name = line.split("uses: ")[1].split("@")[0]
            assert line.endswith(f" # {pinned[name].tag}")


def test_no_job_restores_a_cache_and_no_checkout_keeps_credentials():
    doc = yaml.safe_load(WORKFLOW.read_text())
    steps = _steps(doc)
    assert not [s for s in steps if s.get("uses", "").startswith("actions/cache")]
    checkouts = [s for s in steps if s.get("uses", "").startswith("actions/checkout@")]
    # every build shard, the windows job and the publish job check the repository out
    building = [j for j in doc["jobs"] if j.startswith("build-") or j == "windows"]
    assert len(checkouts) == len(building) + 1
    assert all(s["with"]["persist-credentials"] is False for s in checkouts)


def test_permissions_are_per_job_and_least():
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert doc["permissions"] == {}
    for name, job in doc["jobs"].items():
        if name.startswith("build-"):
            assert job["permissions"] == {"contents": "read"}
    assert doc["jobs"]["publish"]["permissions"] == {
        "contents": "write",
        "id-token": "write",
        "attestations": "write",
    }
    assert doc["jobs"]["pages"]["permissions"] == {"pages": "write", "id-token": "write"}


def test_wheels_and_index_are_attested_before_they_are_uploaded():
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["publish"]["steps"]
    names = [s.get("uses", "").split("@")[0] or s.get("run", "") for s in steps]
    attest = next(
        i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/attest-build-provenance@")
    )
    subjects = ["wheels/*.whl", "wheels/index.json", "wheels/index.html"]
    assert steps[attest]["with"]["subject-path"].split() == subjects
    index = next(i for i, n in enumerate(names) if "fa index wheels" in n)
    upload = next(i for i, n in enumerate(names) if "gh release upload" in n)
    pages = names.index("actions/upload-pages-artifact")
    assert index < attest < min(upload, pages)


# -- fa ci pins --refresh, against real repositories on disk ------------------------------------------


def _git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(cwd),
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def _action_repo(base: Path, name: str, tags: list[tuple[str, bool]]) -> dict[str, str]:
    """A git repository at base/name with one commit per tag (annotated or not); tag -> commit."""
    repo = base / name
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    commits = {}
    for tag, annotated in tags:
        _git(repo, "commit", "-q", "--allow-empty", "-m", tag)
        _git(repo, "tag", *(["-a", "-m", tag] if annotated else []), tag)
        commits[tag] = _git(repo, "rev-parse", "HEAD")
    return commits


def test_refresh_moves_each_pin_to_the_newest_release_of_its_major(tmp_path):
    base = tmp_path / "remote"
    checkout = _action_repo(
        base,
        "actions/checkout",
        [("v4.0.0", True), ("v4.2.0", False), ("v4.10.1", True), ("v4-beta", False), ("v5.0.0", True)],
    )
    publish = _action_repo(base, "pypa/gh-action-pypi-publish", [("v1.9.0", False), ("v1.13.0", True)])
    pins_file = tmp_path / "pins.json"
    pins.save(
        {
            "actions/checkout": pins.Pin("0" * 40, "v4.1.0"),
            "pypa/gh-action-pypi-publish": pins.Pin("1" * 40, "v1.9.0"),
        },
        pins_file,
    )

    result = runner.invoke(app, ["ci", "pins", "--refresh", "--pins", str(pins_file), "--from", str(base)])

    assert result.exit_code == 0, result.output
    fresh = pins.load(pins_file)
    assert fresh["actions/checkout"] == pins.Pin(checkout["v4.10.1"], "v4.10.1")  # 10 > 2; v5 is not v4
    assert fresh["pypa/gh-action-pypi-publish"] == pins.Pin(
        publish["v1.13.0"], "v1.13.0"
    )  # the commit, not the tag object
    assert "v4.1.0 -> v4.10.1" in result.output


def test_refresh_with_no_release_of_the_major_names_the_action(tmp_path):
    base = tmp_path / "remote"
    _action_repo(base, "actions/checkout", [("v5.0.0", False)])
    pins_file = tmp_path / "pins.json"
    pins.save({"actions/checkout": pins.Pin("0" * 40, "v4.1.0")}, pins_file)
    before = pins_file.read_text()

    result = runner.invoke(app, ["ci", "pins", "--refresh", "--pins", str(pins_file), "--from", str(base)])

    assert result.exit_code == 1
    assert "no release tag v4.x.y; pin actions/checkout by hand" in result.output
    assert pins_file.read_text() == before


def test_no_from_value_reaches_git_as_an_option(tmp_path):
    """Round three: `--from "--upload-pack=touch pwned;"` was passed to git as an option, and git ran
    it (from a checkout with a remote, whose origin it then asked); now exit 2 naming --from."""
    origin = tmp_path / "origin"
    _action_repo(origin, "x", [("v1.0.0", False)])
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    _git(checkout, "init", "-q")
    _git(checkout, "remote", "add", "origin", str(origin / "x"))
    pins_file = tmp_path / "pins.json"
    pins.save({"actions/checkout": pins.Pin("0" * 40, "v4.1.0")}, pins_file)
    for value in (
        "--upload-pack=touch pwned;",
        "-c",
        "",
        "  ",
        "not a url",
        "ext::sh -c touch% pwned",
        "ftp://example.com",
        "https://",
        "file",  # a word, not a folder here
    ):
        done = subprocess.run(
            [sys.executable, "-m", "buildtool.cli", "ci", "pins", "--refresh", "--pins", str(pins_file),
             "--from", value],
            cwd=checkout, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 2, (value, done.stdout, done.stderr)
        assert "--from: " in done.stderr, (value, done.stderr)
        assert "fix: pass a URL" in done.stderr
        assert not (checkout / "pwned").exists()


@pytest.mark.parametrize("hazard", ["symlink", "fifo", "dev_zero", "deep", "folder"])
def test_the_pins_file_is_read_only_as_fas_own_file(tmp_path, hazard):
    from tests.hostile import plant

    pins_file = tmp_path / "pins.json"
    intact = plant(pins_file, hazard)
    for refresh in ([], ["--refresh", "--from", str(tmp_path)]):
        done = subprocess.run(
            [sys.executable, "-m", "buildtool.cli", "ci", "pins", "--pins", str(pins_file), *refresh],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert f"{pins_file}: " in done.stderr
        assert "fix: " in done.stderr
        assert "Traceback" not in done.stderr
    intact()


def test_a_pins_file_in_a_linked_folder_is_read(tmp_path):
    """The folder a person names may be a link; the pins file itself never is."""
    real = tmp_path / "real"
    real.mkdir()
    pins.save({"actions/checkout": pins.Pin("0" * 40, "v4.1.0")}, real / "pins.json")
    (tmp_path / "linked").symlink_to(real)
    assert pins.load(tmp_path / "linked" / "pins.json") == {"actions/checkout": pins.Pin("0" * 40, "v4.1.0")}
