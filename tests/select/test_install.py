"""`fa install` into a fresh venv (system site-packages, so torch is visible) from a local directory and
from an http index on 127.0.0.1; a tampered or broken wheel is refused with nothing installed, and only
fa-attn ever changes in `pip freeze`."""

from __future__ import annotations

import functools
import http.server
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildtool.compat.probe import probe
from tests.select.conftest import make_venv, run_fa, this_checkout
from tests.select.tiny_wheels import BROKEN_WHEN_INSTALLED, build_wheelhouse

# Each test makes a venv and runs pip several times (about 10 s each): slow, but still run in CI.
pytestmark = pytest.mark.slow


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    return make_venv(tmp_path / "venv")


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    env = probe()
    assert env.torch is not None, "these tests need torch installed (it is a test dependency)"
    return build_wheelhouse(tmp_path / "wheels", env.torch.minor, bool(env.torch.cxx11abi))


def fa(python: Path, *args: str, cwd: Path) -> tuple[int, dict]:
    done = run_fa(python, *args, "--json", cwd=cwd)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def freeze(python: Path) -> set[str]:
    done = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True
    )
    return set(done.stdout.splitlines())


def changed(before: set[str], after: set[str]) -> set[str]:
    """Names of the distributions whose freeze line differs ("name==v" or "name @ url")."""
    return {line.split("==")[0].split(" @ ")[0] for line in before ^ after}


def installed(python: Path) -> str | None:
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('fa-attn'))"],
        check=False,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def broken_once_installed(out_dir: Path) -> Path:
    """0.2.0 wheels for this machine's torch in out_dir: this machine's imports in pip's trial directory
    but not once installed."""
    torch = probe().torch
    assert torch is not None
    return build_wheelhouse(
        out_dir,
        torch.minor,
        bool(torch.cxx11abi),
        broken=expected_variant(),
        init_py=BROKEN_WHEN_INSTALLED,
        version="0.2.0",
    )


def expected_variant() -> str:
    # No GPU and no driver here: every wheel for this torch fits; the highest CUDA major wins.
    torch = probe().torch
    assert torch is not None
    return f"cu13torch{torch.minor}" if torch.cxx11abi else f"cu13torch{torch.minor}cxx11abifalse"


def test_install_from_local_dir(venv: Path, wheelhouse: Path, tmp_path: Path):
    before = freeze(venv)
    rc, out = fa(venv, "install", "--wheels", str(wheelhouse), cwd=tmp_path)
    assert rc == 0, out["message"]
    assert out["variant"] == expected_variant()
    assert out["verdict"] == "fallback"
    assert out["ok"]
    assert installed(venv) == out["installed"] == f"0.1.0+{expected_variant()}"
    after = freeze(venv)
    assert changed(before, after) == {"fa-attn"}


def test_the_report_is_sentences_and_the_commands_only_under_verbose(
    venv: Path, wheelhouse: Path, tmp_path: Path
):
    """Issue 37: fa install printed about 20 lines of shell-quoted Python (each step's command)."""
    quiet = run_fa(venv, "install", "--wheels", str(wheelhouse), cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    text = " ".join(quiet.stdout.split())  # lines wrapped at the terminal width, joined back
    wheel = next(wheelhouse.glob(f"*+{expected_variant()}-*.whl")).name
    assert f"installing {wheel} from {wheelhouse}" in text
    assert f"installed fa-attn 0.1.0+{expected_variant()}" in text
    assert "trial import" not in text, quiet.stdout
    assert "'" not in text, quiet.stdout  # no shell quoting
    again = run_fa(venv, "install", "--wheels", str(wheelhouse), "--verbose", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    said = " ".join(again.stdout.split())
    assert "set aside fa-attn 0.1.0+" in said  # the one installed just before
    assert "trial import: " in said  # the exact commands, for whoever asks


def test_dry_run_changes_nothing(venv: Path, wheelhouse: Path, tmp_path: Path):
    rc, out = fa(venv, "install", "--wheels", str(wheelhouse), "--dry-run", cwd=tmp_path)
    assert rc == 0
    assert out["dry_run"]
    assert out["command"][-1] == str(wheelhouse / out["selected"])
    assert "--no-deps" in out["command"]
    assert installed(venv) is None


@pytest.fixture
def http_index(wheelhouse: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(wheelhouse))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_install_from_http_index(venv: Path, http_index: str, tmp_path: Path):
    before = freeze(venv)
    rc, out = fa(venv, "install", "--index", http_index, cwd=tmp_path)
    assert rc == 0, out["message"]
    assert out["source"].startswith(http_index)
    assert out["variant"] == expected_variant()
    assert installed(venv) == f"0.1.0+{expected_variant()}"
    assert changed(before, freeze(venv)) == {"fa-attn"}


def test_tampered_wheel_is_refused(venv: Path, wheelhouse: Path, tmp_path: Path):
    target = next(wheelhouse.glob(f"*{expected_variant()}-*.whl"))
    with target.open("r+b") as f:  # same size, other bytes: only the hash can tell
        f.seek(100)
        f.write(b"tampered")
    before = freeze(venv)
    rc, out = fa(venv, "install", "--wheels", str(wheelhouse), cwd=tmp_path)
    assert rc == 1
    assert not out["ok"]
    assert "sha256" in out["message"]
    assert "nothing installed" in out["message"]
    assert installed(venv) is None
    assert freeze(venv) == before


def test_broken_wheel_is_refused_before_installing(venv: Path, tmp_path: Path):
    torch = probe().torch
    assert torch is not None
    broken = build_wheelhouse(
        tmp_path / "broken", torch.minor, bool(torch.cxx11abi), broken=expected_variant()
    )
    before = freeze(venv)
    rc, out = fa(venv, "install", "--wheels", str(broken), cwd=tmp_path)
    assert rc == 1
    assert "deliberately broken" in out["message"]
    assert "nothing installed" in out["message"]
    assert installed(venv) is None
    assert freeze(venv) == before


def test_no_wheel_exits_1(venv: Path, tmp_path: Path):
    # Only a wheel for another torch: nothing fits this machine.
    house = tmp_path / "other"
    build_wheelhouse(house, "2.4", False)
    index = json.loads((house / "index.json").read_text())
    index["wheels"] = [w for w in index["wheels"] if w["torch"] == "2.4"]
    (house / "index.json").write_text(json.dumps(index))
    rc, out = fa(venv, "install", "--wheels", str(house), cwd=tmp_path)
    assert rc == 1
    assert out["verdict"] == "no-wheel"
    assert out["selected"] is None
    assert "torch-version-mismatch" in out["codes"]
    assert "fa install --build" in out["message"]  # never silently: the fix is named, nothing is built
    assert installed(venv) is None


def test_build_needs_a_cuda_major_and_an_arch_it_cannot_guess(venv: Path, tmp_path: Path):
    """CI's torch is a CPU build and the machine has no GPU: --build says which option to pass (exit 2)."""
    for args, missing in ((["--build"], "--cuda"), (["--build", "--cuda", "12"], "--arch")):
        done = run_fa(venv, "install", *args, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert missing in done.stderr, done.stderr
        assert "fix:" in done.stderr, done.stderr
    assert installed(venv) is None


def test_failed_final_check_rolls_back_to_the_previous_version(venv: Path, wheelhouse: Path, tmp_path: Path):
    rc, out = fa(venv, "install", "--wheels", str(wheelhouse), cwd=tmp_path)
    assert rc == 0
    assert installed(venv) == f"0.1.0+{expected_variant()}"
    before = freeze(venv)
    # 0.2.0 imports in the trial directory but not once installed; 0.1.0 is still in the same index.
    broken_once_installed(wheelhouse)
    rc, out = fa(venv, "install", "--wheels", str(wheelhouse), cwd=tmp_path)
    assert rc == 1
    assert out["selected"].startswith("fa_attn-0.2.0+")
    assert "broken once installed" in out["message"]
    assert "rolled back" in out["message"]
    assert installed(venv) == f"0.1.0+{expected_variant()}"
    assert changed(before, freeze(venv)) <= {"fa-attn"}  # the same version, reinstalled from the index


def test_wheel_whose_metadata_disagrees_with_the_index_is_refused_before_anything_changes(
    venv: Path, wheelhouse: Path, tmp_path: Path
):
    """index.json (and the file name) say 0.3.0, the wheel's own metadata 0.2.0: pip would install
    0.2.0, and the old fa install uninstalled the working fa-attn and then printed a fix that failed.
    Now it is refused before anything is touched."""
    rc, out = fa(venv, "install", "--wheels", str(wheelhouse), cwd=tmp_path)
    assert rc == 0
    assert installed(venv) == f"0.1.0+{expected_variant()}"
    before = freeze(venv)
    torch = probe().torch
    assert torch is not None
    other = build_wheelhouse(tmp_path / "other", torch.minor, bool(torch.cxx11abi), version="0.2.0")
    index = json.loads((other / "index.json").read_text())
    for entry in index["wheels"]:
        renamed = entry["file"].replace("0.2.0", "0.3.0", 1)
        (other / entry["file"]).rename(other / renamed)
        entry["file"], entry["version"] = renamed, entry["version"].replace("0.2.0", "0.3.0", 1)
    (other / "index.json").write_text(json.dumps(index))
    rc, out = fa(venv, "install", "--wheels", str(other), cwd=tmp_path)
    assert rc == 1
    assert not out["ok"]
    assert "fa_attn-0.2.0" in out["message"]
    assert "nothing installed" in out["message"]
    assert installed(venv) == f"0.1.0+{expected_variant()}"
    assert freeze(venv) == before


def test_failed_install_puts_back_a_previous_version_the_index_does_not_have(
    venv: Path, wheelhouse: Path, tmp_path: Path
):
    rc, out = fa(venv, "install", "--wheels", str(wheelhouse), cwd=tmp_path)
    assert rc == 0
    assert installed(venv) == f"0.1.0+{expected_variant()}"
    before = freeze(venv)
    newer = broken_once_installed(tmp_path / "newer")  # holds only 0.2.0
    rc, out = fa(venv, "install", "--wheels", str(newer), cwd=tmp_path)
    assert rc == 1
    assert "broken once installed" in out["message"]
    assert f"the previous fa-attn 0.1.0+{expected_variant()} is back in place" in out["message"]
    assert installed(venv) == f"0.1.0+{expected_variant()}"
    assert freeze(venv) == before
    check = subprocess.run([str(venv), "-c", "import fa_attn"], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_pip_variables_that_move_files_are_ignored_and_named(venv: Path, wheelhouse: Path, tmp_path: Path):
    """PIP_TARGET, PIP_PREFIX, PIP_ROOT and PIP_USER would send pip's files elsewhere (or make it refuse
    --target); fa installs into the environment it probed, and says it ignored them."""
    elsewhere = tmp_path / "elsewhere"
    moved = {"PIP_TARGET": "t", "PIP_PREFIX": "p", "PIP_ROOT": "r"}
    env = {**this_checkout(), **{k: str(elsewhere / v) for k, v in moved.items()}, "PIP_USER": "1"}
    done = run_fa(venv, "install", "--wheels", str(wheelhouse), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert installed(venv) == f"0.1.0+{expected_variant()}"
    assert not elsewhere.exists()
    said = " ".join(done.stdout.split())
    for name in [*moved, "PIP_USER"]:
        assert f"{name}=" in said
    assert "is ignored: fa installs into the environment it probed" in said


def test_too_little_space_names_the_folder_and_the_space_needed(tmp_path: Path):
    import shutil as sh

    from buildtool.compat.install import InstallError, _check_space

    work = tmp_path / ".fa-attn-install" / "work"
    work.mkdir(parents=True)
    free = sh.disk_usage(work).free
    with pytest.raises(InstallError) as caught:
        _check_space(work, free + (1 << 30), "the wheel's files unpacked")
    message = str(caught.value)
    assert f"not enough space in {tmp_path}" in message
    assert f"{(free + (1 << 30) + (1 << 20)) / (1 << 20):.1f} MiB" in message
    assert "fix: free some space" in message


def _site_packages(python: Path) -> Path:
    return next((python.parent.parent / "lib").glob("python*/site-packages"))


def _refused(python: Path, house: Path, cwd: Path) -> str:
    rc, out = fa(python, "install", "--wheels", str(house), cwd=cwd)
    assert rc == 1
    assert "nothing installed" in out["message"]
    return str(out["message"])


def test_a_package_folder_nobody_owns_is_left_alone(venv: Path, wheelhouse: Path, tmp_path: Path):
    """The remains of a removed install (fa_attn/ without a .dist-info) are not fa's to delete."""
    orphan = _site_packages(venv) / "fa_attn"
    orphan.mkdir()
    (orphan / "mine.py").write_text("kept = True\n")
    message = _refused(venv, wheelhouse, tmp_path)
    assert "no installed distribution owns it" in message
    assert (orphan / "mine.py").read_text() == "kept = True\n"


def test_a_previous_install_fa_could_not_put_back_whole_is_not_replaced(
    venv: Path, wheelhouse: Path, tmp_path: Path
):
    rc, _ = fa(venv, "install", "--wheels", str(wheelhouse), cwd=tmp_path)
    assert rc == 0
    site = _site_packages(venv)
    # A file in the package that its RECORD does not list (a user's): replacing would delete it.
    (site / "fa_attn" / "notes.txt").write_text("mine\n")
    message = _refused(venv, wheelhouse, tmp_path)
    assert "notes.txt is not one of the installed fa-attn's files" in message
    (site / "fa_attn" / "notes.txt").unlink()
    # A RECORD listing a file outside fa_attn/ and its .dist-info (a script): it could not be put back.
    record = next(site.glob("fa_attn-*.dist-info")) / "RECORD"
    record.write_text(record.read_text() + "../../../bin/fa-attn-tool,,\n")
    message = _refused(venv, wheelhouse, tmp_path)
    assert "has files outside fa_attn/ and its .dist-info" in message
    assert installed(venv) == f"0.1.0+{expected_variant()}"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs (needs the right to mount: root here, skipped elsewhere)."""
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(where)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_full_file_system_is_named_before_anything_is_written(
    small_fs: Path, wheelhouse: Path, tmp_path: Path
):
    python = make_venv(small_fs / "venv")
    rc, out = fa(python, "install", "--wheels", str(wheelhouse), cwd=tmp_path)
    assert rc == 1
    site = _site_packages(python)
    assert f"not enough space in {site}" in out["message"]
    assert "MiB is free" in out["message"]
    assert "fix: free some space" in out["message"]
    assert installed(python) is None
    assert sorted(p.name for p in (site / ".fa-attn-install").iterdir()) == ["lock"]
