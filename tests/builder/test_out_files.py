"""`--out` is a user's folder: fa replaces only files it wrote there (recorded with their sha256), never
writes through a link below it, refuses a wheel of its own that changed since (never re-indexes it
silently) and merges wheels of other platforms into the index instead of deleting them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildtool.builder import index, out_files, package
from buildtool.builder.compile import KernelTree
from buildtool.cli import app
from buildtool.core.fetch import sha256_file
from buildtool.core.runtime import schema
from tests.builder.test_package_index import _build, _spec, host_lib, images  # noqa: F401 (fixtures)
from tests.hostile import OWN_FILE_HAZARDS, plant

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def built(fixture_tree, images, host_lib, tmp_path):  # noqa: F811 (the imported fixtures)
    """An --out folder holding one wheel fa built."""
    out = tmp_path / "wheels"
    wheel = _build(_spec("2.8"), out, fixture_tree, images, host_lib).path
    return out, wheel


@pytest.mark.parametrize("rel", ["index.json", "simple/index.html", "simple/fa-attn/index.html"])
def test_a_users_index_files_are_not_overwritten(built, rel):
    out, _ = built
    mine = out / rel
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text("my own index\n")
    with pytest.raises(out_files.OutFileError, match="fa did not write it") as err:
        index.write_index(out)
    assert str(mine) in str(err.value)
    assert mine.read_text() == "my own index\n"


def test_a_users_build_log_is_not_overwritten(built):
    out, _ = built
    (out / "logs").mkdir()
    (out / "logs" / "build.json").write_text('{"mine": true}\n')
    with pytest.raises(out_files.OutFileError, match=r"logs/build.json: fa did not write it"):
        out_files.write_json(out, "logs/build.json", {"wheels": []})  # what the pipeline's log write is
    assert json.loads((out / "logs" / "build.json").read_text()) == {"mine": True}


def test_fa_rewrites_its_own_index_files(built):
    out, wheel = built
    index.write_index(out)
    (out / "logs").mkdir()
    out_files.write_json(out, "logs/build.json", {"n": 1})
    out_files.write_json(out, "logs/build.json", {"n": 2})
    data = index.write_index(out)
    assert [w["file"] for w in data["wheels"]] == [wheel.name]
    recorded = out_files.written(out)
    assert recorded["index.json"] == [sha256_file(out / "index.json")]
    assert recorded["logs/build.json"] == [sha256_file(out / "logs" / "build.json")]


@pytest.mark.parametrize("folder", ["simple", "logs"])
def test_nothing_is_written_through_a_linked_folder(built, tmp_path, folder):
    out, _ = built
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("x")
    (out / folder).symlink_to(elsewhere)
    write = {
        "simple": lambda: index.write_index(out),
        "logs": lambda: out_files.write_json(out, "logs/b.json", {}),
    }
    with pytest.raises(out_files.OutFileError, match="a symbolic link"):
        write[folder]()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]


def test_fa_index_takes_over_the_index_but_never_follows_a_link(built, tmp_path):
    out, _ = built
    (out / "index.json").write_text(json.dumps(schema.index_json([])))  # a shard's, copied in
    result = CliRunner().invoke(app, ["index", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "index.json").read_text())["wheels"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "simple" / "fa-attn" / "index.html").unlink()
    (out / "simple" / "fa-attn").rmdir()
    (out / "simple" / "fa-attn").symlink_to(elsewhere)
    result = CliRunner().invoke(app, ["index", str(out)])
    assert result.exit_code == 2
    assert "a symbolic link" in result.output
    assert list(elsewhere.iterdir()) == []


def _tamper(wheel: Path) -> None:
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr("fa_attn/evil.py", "import os\n")


def test_a_tampered_wheel_is_not_reindexed(built):
    out, wheel = built
    index.write_index(out)
    before = (out / "index.json").read_text()
    _tamper(wheel)
    with pytest.raises(out_files.OutFileError, match="changed since fa wrote it") as err:
        index.write_index(out)
    assert wheel.name in str(err.value)
    assert (out / "index.json").read_text() == before


def test_a_tampered_wheel_is_set_aside_and_written_again_by_a_rebuild(
    built,
    fixture_tree,
    images,  # noqa: F811
    host_lib,  # noqa: F811
    capfd,
):
    """Round three: a tampered wheel in --out survived a rebuild (refused, kept in place, the build
    failed). Now it is kept beside, under a name fa index does not list, and the wheel written again."""
    out, wheel = built
    fresh = wheel.read_bytes()
    _tamper(wheel)
    tampered = wheel.read_bytes()
    _build(_spec("2.8"), out, fixture_tree, images, host_lib)
    assert wheel.read_bytes() == fresh
    (aside,) = out.glob(f"{wheel.name}{out_files.CHANGED_MARK}*")
    assert aside.read_bytes() == tampered
    assert "set aside as" in capfd.readouterr().err
    index.write_index(out)  # the rebuilt wheel is fa's again; the one set aside is not listed
    assert [e["file"] for e in json.loads((out / "index.json").read_text())["wheels"]] == [wheel.name]


def test_a_users_wheel_of_the_same_name_is_not_overwritten(fixture_tree, images, host_lib, tmp_path):  # noqa: F811
    elsewhere = _build(_spec("2.8"), tmp_path / "elsewhere", fixture_tree, images, host_lib).path
    out = tmp_path / "wheels"
    out.mkdir()
    theirs = out / elsewhere.name
    theirs.write_bytes(elsewhere.read_bytes() + b"\0")  # same name, not fa's bytes here
    with pytest.raises(out_files.OutFileError, match="fa did not write it"):
        _build(_spec("2.8"), out, fixture_tree, images, host_lib)
    assert theirs.read_bytes() == elsewhere.read_bytes() + b"\0"


def _as_platform(wheel: Path, out: Path, platform: str, fixture_tree: Path) -> Path:
    """fa writing the same wheel under another platform tag (as a build on another machine does)."""
    spec = _spec("2.8")
    man = package.manifest(spec, KernelTree(fixture_tree).tiles)
    with zipfile.ZipFile(wheel) as zf:
        files = {
            n: zf.read(n) for n in zf.namelist() if ".dist-info/" not in n and n != "fa_attn/manifest.json"
        }
    return package.write_wheel(files, man, spec.version, platform, out)


def test_wheels_of_other_platform_tags_are_kept_and_merged(built, fixture_tree, images, host_lib, tmp_path):  # noqa: F811
    out, wheel = built
    # One fa wrote here earlier under another tag, and one built elsewhere and copied in.
    earlier = _as_platform(wheel, out, "manylinux_2_17_x86_64", fixture_tree)
    other = tmp_path / "other"
    copied = out / _as_platform(wheel, other, "manylinux_2_34_x86_64", fixture_tree).name
    copied.write_bytes((other / copied.name).read_bytes())
    rebuilt = _build(_spec("2.8"), out, fixture_tree, images, host_lib).path
    assert rebuilt == wheel
    data = index.write_index(out)
    names = {w["file"] for w in data["wheels"]}
    assert names == {wheel.name, earlier.name, copied.name}
    assert earlier.exists()
    assert copied.exists()


def test_a_kill_between_record_and_rename_still_finds_the_file_its_own(built):
    out, wheel = built
    out_files.note(out, wheel.name, "f" * 64, pending=True)  # recorded, then killed before the rename
    assert out_files.own(out, wheel.name)
    out_files.claim(out, wheel.name)


def test_two_processes_writing_into_one_folder_record_every_file(tmp_path):
    code = (
        "import sys; from pathlib import Path; from buildtool.builder import out_files\n"
        "for i in range(20): out_files.write_text(Path(sys.argv[1]), f'logs/{sys.argv[2]}-{i}.json', 'x')\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path), name], cwd=REPO)
        for name in ("a", "b", "c")
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert len(out_files.written(tmp_path)) == 60


def test_a_damaged_record_is_named(tmp_path):
    (tmp_path / out_files.RECORD).write_text("[1, 2")
    with pytest.raises(out_files.OutFileError, match=r"\.fa-written\.json: is not JSON"):
        out_files.write_text(tmp_path, "index.json", "{}")


def _fa_index(folder: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "buildtool.cli", "index", str(folder)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "hazard"),
    [(out_files.RECORD, h) for h in OWN_FILE_HAZARDS]
    + [(f"{out_files.RECORD}.lock", h) for h in OWN_FILE_HAZARDS if h != "deep"],  # a lock's bytes are fa's
)
def test_the_record_and_its_lock_are_only_ever_fas_own_files(tmp_path, name, hazard):
    """Round three: a FIFO as .fa-written.json hung fa index, /dev/zero read until MemoryError; a
    folder as its lock gave IsADirectoryError, a linked lock was followed."""
    path = tmp_path / name
    intact = plant(path, hazard)
    done = _fa_index(tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"{path}: " in done.stderr
    assert "fix: " in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "index.json").exists()
    intact()


def test_a_held_record_lock_says_who_holds_it_then_waits(tmp_path):
    """Round three: a held .fa-written.json.lock made fa index wait forever with no output."""
    lock = tmp_path / f"{out_files.RECORD}.lock"
    code = (
        "import sys, time; from buildtool.core.runtime import ownfiles\n"
        f"with ownfiles.locked({str(lock)!r}, timeout=0):\n"
        "    print('held', flush=True); time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        index_run = subprocess.Popen(
            [sys.executable, "-m", "buildtool.cli", "index", str(tmp_path)],
            cwd=REPO, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert index_run.stderr is not None
        first = index_run.stderr.readline()  # blocks until fa says something: what it is doing
        assert first.startswith("fa index: ")
        said = index_run.stderr.readline()  # then who holds the lock
        assert f"{lock}" in said
        assert f"pid {holder.pid}" in said
        assert "waiting up to" in said
    finally:
        holder.kill()
        holder.wait()
    assert index_run.wait(timeout=60) == 0
    assert (tmp_path / "index.json").is_file()


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("simple/index.html", "<html><a href='mypkg/'>mypkg</a></html>\n"),  # their other projects
        ("simple/fa-attn/index.html", "<html>my own links</html>\n"),
        ("index.json", "an old index of mine\n"),
    ],
)
def test_fa_index_never_replaces_a_users_own_index_files(built, rel, text):
    """Round three: fa index replaced a user's own simple/index.html without a word."""
    out, _ = built
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    (out / rel).write_text(text)
    result = CliRunner().invoke(app, ["index", str(out)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"{out / rel}: fa did not write it" in said
    assert "fix: move it out of" in said
    assert (out / rel).read_text() == text


def test_fa_index_takes_over_the_pages_of_a_shard_copied_in(built, tmp_path):
    out, _ = built
    shard = tmp_path / "shard"
    shard.mkdir()
    assert CliRunner().invoke(app, ["index", str(shard)]).exit_code == 0
    shutil.copytree(shard / "simple", out / "simple")
    result = CliRunner().invoke(app, ["index", str(out)])
    assert result.exit_code == 0, result.output
    assert "simple/fa-attn/index.html" in out_files.written(out)  # rewritten, now recorded as fa's


def test_fa_index_of_an_empty_argument_is_bad_input(tmp_path):
    """Round three: `fa index ""` indexed the current folder."""
    done = subprocess.run(
        [sys.executable, "-m", "buildtool.cli", "index", ""],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "DIRECTORY: is empty" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("rel", "hazard", "named"),
    [
        ("index.json", "fifo", "index.json: not a regular file"),
        ("index.json", "folder", "index.json: a folder"),
        ("simple/fa-attn/index.html", "folder", "index.html: a folder"),
        ("simple", "file", "simple: not a folder, where fa writes simple/index.html"),
        ("simple", "fifo", "simple: not a folder, where fa writes simple/index.html"),
    ],
)
def test_a_folder_or_fifo_where_an_index_file_belongs_is_named_and_kept(tmp_path, rel, hazard, named):
    path = tmp_path / rel
    if hazard == "file":
        path.write_text("a user's notes\n")
        intact = lambda: path.read_text() == "a user's notes\n"
    else:
        check = plant(path, hazard)
        intact = lambda: check() is None
    done = _fa_index(tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert named in done.stderr
    assert "fix: move it out of" in done.stderr
    assert intact()


@pytest.mark.parametrize("hazard", ["folder", "fifo"])
def test_a_folder_or_fifo_named_like_a_wheel_is_named(tmp_path, hazard):
    intact = plant(tmp_path / "fa_attn-0.1.0-py3-none-any.whl", hazard)
    done = _fa_index(tmp_path, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "so not a wheel" in done.stderr
    assert "fix: move it out of" in done.stderr
    intact()


def test_an_out_folder_given_as_a_link_is_used(tmp_path):
    """The folder a person names may be a link (`wheels -> /data/wheels`): resolved once; fa's own
    files in it are still never followed."""
    real = tmp_path / "data" / "wheels"
    real.mkdir(parents=True)
    (tmp_path / "wheels").symlink_to(real)
    done = _fa_index(tmp_path / "wheels", timeout=60)
    assert done.returncode == 0, done.stderr
    assert (real / out_files.RECORD).is_file()
    assert (real / "index.json").is_file()
