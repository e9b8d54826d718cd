"""`fa install` interrupted at each of its steps by a real signal, two runs into one environment, and
a kill -9 recovered by the next run. After SIGINT or SIGTERM the environment holds the old fa-attn
(or, once committed, the new one) and nothing else: one fa-attn, no transaction folder, nothing in
TMPDIR, no installer process. After SIGKILL the journal lets the next fa install put it right.

fa is stopped (SIGSTOP) at a named step (FA_INSTALL_STOP_AT, compat/install_txn.py), the signal is
sent, and fa continued; during pip's step the signal is sent once pip is running."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from buildtool.compat import install_txn
from buildtool.compat.probe import probe
from tests.select.conftest import make_venv, run_fa, this_checkout
from tests.select.test_install import expected_variant, installed
from tests.select.tiny_wheels import build_wheelhouse

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc"),
]

OLD, NEW = "0.1.0", "0.2.0"
# Every step fa can be stopped at, in order: the lock taken, the wheel fetched and checked, pip's
# scratch install, the trial import, each rename (the old folders out, the new ones in), the swap
# done, the commit.
STEPS = (
    "locked",
    "fetched",
    "staged",
    "trial-imported",
    "out-1",
    "out-2",
    "in-1",
    "in-2",
    "swapped",
    "committed",
)


def _variant_version(version: str) -> str:
    return f"{version}+{expected_variant()}"


@pytest.fixture(scope="module")
def houses(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    torch = probe().torch
    assert torch is not None
    root = tmp_path_factory.mktemp("houses")
    old = build_wheelhouse(root / "old", torch.minor, bool(torch.cxx11abi), version=OLD)
    new = build_wheelhouse(root / "new", torch.minor, bool(torch.cxx11abi), version=NEW)
    return old, new


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, houses: tuple[Path, Path]) -> Path:
    """A venv with fa-attn 0.1.0 installed by fa, copied for each test."""
    root = tmp_path_factory.mktemp("template")
    venv = root / "venv"
    done = _fa(make_venv(venv), "install", "--wheels", str(houses[0]), cwd=root)
    assert done.returncode == 0, done.stderr
    return venv


@pytest.fixture
def venv(tmp_path: Path, template: Path) -> Path:
    shutil.copytree(template, tmp_path / "venv", symlinks=True)
    python = tmp_path / "venv" / "bin" / "python"
    assert installed(python) == _variant_version(OLD)
    return python


PIP_ONLY = "FA_TEST_PIP_ONLY"  # not fa's: read by _env below


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """This checkout's fa with TMPDIR in `tmp`; uv when it is on PATH (faster), unless PIP_ONLY is
    given: pip's scratch install takes long enough to be signalled while it runs."""
    env = this_checkout()
    uv = shutil.which("uv")
    if uv and extra.pop(PIP_ONLY, None):
        env["PATH"] = os.pathsep.join(
            p for p in env["PATH"].split(os.pathsep) if p and Path(p).resolve() != Path(uv).parent.resolve()
        )
    tmp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp)
    env.update(extra)
    return env


def _fa(python: Path, *args: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_fa(python, *args, cwd=cwd, env=_env(cwd / "tmpdir", **extra))


class Run:
    """fa install running in the background, its output (stdout and stderr) going to a file."""

    def __init__(self, python: Path, house: Path, cwd: Path, name: str, **extra: str) -> None:
        self.log = cwd / f"{name}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(python), "-m", "buildtool.cli", "install", "--wheels", str(house)],
                env=_env(cwd / "tmpdir", **extra),
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, as a shell's foreground job has
            )
        self.pid = self.proc.pid

    def output(self) -> str:
        return self.log.read_text()

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)

    def running(self) -> bool:
        return self.proc.poll() is None


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _wait_stopped(run: Run, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.running(), run.output()
        if _state(run.pid) == "T":
            return
        time.sleep(0.02)
    raise AssertionError("fa never reached its stop")


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    found: set[int] = set()
    todo = [root]
    while todo:
        parent = todo.pop()
        kids = {pid for pid, ppid in parents.items() if ppid == parent} - found
        found |= kids
        todo.extend(kids)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if _state(pid) not in "ZX":
                alive.add(pid)
        except OSError:
            pass
    return alive


def _site(python: Path) -> Path:
    return next((python.parent.parent / "lib").glob("python*/site-packages"))


def _dist_infos(python: Path) -> list[str]:
    return sorted(p.name for p in _site(python).glob("fa_attn-*.dist-info"))


def _assert_whole(python: Path, version: str) -> None:
    """Exactly one fa-attn, of `version`, that imports; nothing of fa's or pip's left over."""
    assert installed(python) == _variant_version(version)
    assert _dist_infos(python) == [f"fa_attn-{_variant_version(version)}.dist-info"]
    check = subprocess.run([str(python), "-c", "import fa_attn"], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    site = _site(python)
    assert not list(site.glob("~*")), "pip's stash left in site-packages"
    assert sorted(p.name for p in (site / install_txn.TXN_DIR).iterdir()) == [install_txn.LOCK_FILE]


@pytest.mark.parametrize(
    ("signum", "step"),
    [(signal.SIGTERM, step) for step in STEPS] + [(signal.SIGINT, step) for step in ("fetched", "in-1")],
)
def test_a_signal_at_each_step_leaves_the_old_or_the_new_fa_attn(
    venv: Path, houses: tuple[Path, Path], tmp_path: Path, signum: int, step: str
):
    run = Run(venv, houses[1], tmp_path, "fa", FA_INSTALL_STOP_AT=step)
    _wait_stopped(run)
    kids = _descendants(run.pid)
    os.kill(run.pid, signum)
    os.kill(run.pid, signal.SIGCONT)
    assert run.wait() == 128 + signum, run.output()
    err = run.output()
    assert f"interrupted by {signal.Signals(signum).name}" in err
    _assert_whole(venv, NEW if step == "committed" else OLD)
    if step == "committed":
        assert "is installed: it had passed its checks" in err
    elif step in STEPS[STEPS.index("out-1") :]:
        assert f"the previous fa-attn {_variant_version(OLD)} is back in place" in err
    assert not list((tmp_path / "tmpdir").iterdir()), "left in TMPDIR"
    assert not _alive(kids)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_pip_runs_stops_pip_and_leaves_nothing(
    venv: Path, houses: tuple[Path, Path], tmp_path: Path, signum: int
):
    run = Run(venv, houses[1], tmp_path, "fa", **{PIP_ONLY: "1"})
    deadline = time.monotonic() + 120
    pip: set[int] = set()
    while not pip and time.monotonic() < deadline:
        assert run.running(), run.output()
        pip = {p for p in _descendants(run.pid) if " pip install " in _cmdline(p)}
        time.sleep(0.01)
    assert pip, "pip never ran"
    kids = _descendants(run.pid)
    os.killpg(run.pid, signum)  # as a terminal's Ctrl-C (or a shell's kill %1): the whole group
    assert run.wait() == 128 + signum, run.output()
    err = run.output()
    assert "nothing had changed" in err
    _assert_whole(venv, OLD)
    assert not list((tmp_path / "tmpdir").iterdir()), "left in TMPDIR"
    deadline = time.monotonic() + 20
    while _alive(kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(kids), [_cmdline(p) for p in _alive(kids)]


@pytest.mark.parametrize("step", ["staged", "out-1", "in-1", "in-2", "committed"])
def test_kill_9_is_put_right_by_the_next_run(
    venv: Path, houses: tuple[Path, Path], tmp_path: Path, step: str
):
    """Killed outright mid-install, the journal lets recovery roll back (or finish, once committed):
    here the recovery alone (install_txn.finish_or_roll_back, what every fa install runs first)."""
    run = Run(venv, houses[1], tmp_path, "fa", FA_INSTALL_STOP_AT=step)
    _wait_stopped(run)
    kids = _descendants(run.pid)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    deadline = time.monotonic() + 20
    while _alive(kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(kids)
    root = _site(venv) / install_txn.TXN_DIR
    said = install_txn.finish_or_roll_back(root, (root.parent,))
    assert said is not None
    if step == "committed":
        assert said.startswith("finished")
        _assert_whole(venv, NEW)
    else:
        assert said.startswith("rolled back" if step != "staged" else "removed the leftovers")
        _assert_whole(venv, OLD)
    assert (
        install_txn.finish_or_roll_back(root, (root.parent,)) is None
    )  # once is enough, and twice is harmless


def test_kill_9_mid_swap_then_fa_install_rolls_back_says_so_and_installs(
    venv: Path, houses: tuple[Path, Path], tmp_path: Path
):
    run = Run(venv, houses[1], tmp_path, "fa", FA_INSTALL_STOP_AT="in-1")
    _wait_stopped(run)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    # Mid-swap: the old folders are out, only the new package is in; no fa-attn dist-info at all.
    assert _dist_infos(venv) == []
    doctor = _fa(venv, "doctor", "--wheels", str(houses[1]), cwd=tmp_path)
    assert "was interrupted; the next fa install rolls it back" in " ".join(doctor.stderr.split())
    done = _fa(venv, "install", "--wheels", str(houses[1]), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = " ".join((done.stdout + done.stderr).split())  # the console wraps at 80 columns
    assert f"rolled back an interrupted fa install (pid {run.pid}) of fa-attn {_variant_version(NEW)}" in said
    _assert_whole(venv, NEW)


def test_two_installs_at_once_take_turns(venv: Path, houses: tuple[Path, Path], tmp_path: Path):
    """The second waits for the first (saying so), then installs over it: one fa-attn at the end."""
    first = Run(venv, houses[1], tmp_path, "first", FA_INSTALL_STOP_AT="in-1")
    _wait_stopped(first)  # holds the lock, mid-swap
    second = Run(venv, houses[1], tmp_path, "second")
    deadline = time.monotonic() + 120
    while "waiting up to" not in second.output() and time.monotonic() < deadline:
        assert second.running(), second.output()
        time.sleep(0.05)
    assert f"another fa install (pid {first.pid}) is installing into" in " ".join(second.output().split())
    doctor = _fa(venv, "doctor", "--wheels", str(houses[1]), cwd=tmp_path)
    assert f"an fa install (pid {first.pid}) is changing fa-attn" in " ".join(doctor.stderr.split())
    os.kill(first.pid, signal.SIGCONT)
    assert first.wait() == 0, first.output()
    assert second.wait() == 0, second.output()
    _assert_whole(venv, NEW)


def test_a_second_install_with_wait_0_stops_clearly(venv: Path, houses: tuple[Path, Path], tmp_path: Path):
    first = Run(venv, houses[1], tmp_path, "first", FA_INSTALL_STOP_AT="locked")
    _wait_stopped(first)
    done = _fa(venv, "install", "--wheels", str(houses[1]), "--wait", "0", cwd=tmp_path)
    os.kill(first.pid, signal.SIGCONT)
    assert first.wait() == 0, first.output()
    assert done.returncode == 1
    assert f"another fa install (pid {first.pid}) is installing into" in " ".join(
        (done.stdout + done.stderr).split()
    )
    assert "--wait" in done.stdout + done.stderr
    _assert_whole(venv, NEW)
