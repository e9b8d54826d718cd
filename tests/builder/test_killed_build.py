"""A killed `fa build` leaves no process behind: SIGTERM or SIGKILL while NVRTC workers compile (they
used to stay blocked on their task pipe, about 110 MB each), and SIGKILL while g++ builds the binding
(the compiler's cc1plus used to run on)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.builder.conftest import fa_command

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc"),
]

MATRIX = """\
version: "0.1.0"
torch: ["2.8"]
cuda: [12]
python: ["3.11"]
archs:
  12: ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]
kernels: {dtypes: [fp16, bf16], head_dims: [64], directions: [fwd]}
"""


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, command name), from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        out[int(entry)] = (int(ppid), state, name)
    return out


def _descendants(root: int) -> dict[int, str]:
    procs = _processes()
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _, name) in procs.items():
            if ppid == parent and pid not in found:
                found[pid] = name
                todo.append(pid)
    return found


def _alive(pids: dict[int, str]) -> dict[int, str]:
    procs = _processes()
    return {pid: name for pid, name in pids.items() if pid in procs and procs[pid][1] not in ("Z", "X")}


def _start(tmp_path: Path, fixture_tree: Path) -> subprocess.Popen:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    cmd = fa_command("build", "--local", "--out", str(tmp_path / "wheels"), "-j", "2")
    env = {**os.environ, "FA_KERNELS_DIR": str(fixture_tree)}
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for(proc: subprocess.Popen, names: set[str], timeout: float = 300) -> dict[int, str]:
    """The build's descendants, once one of them is called one of `names`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the build finished before it could be killed"
        found = _descendants(proc.pid)
        if names & set(found.values()):
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {names} process appeared")


def _assert_all_gone(children: dict[int, str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while _alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(children), f"left behind: {_alive(children)}"


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_killed_during_kernel_compiles_leaves_no_worker(tmp_path, fixture_tree, fresh_cache, signum):
    proc = _start(tmp_path, fixture_tree)
    images = fresh_cache / "kernels"
    deadline = time.monotonic() + 300
    while not list(images.rglob("*.cubin")) and time.monotonic() < deadline:  # the workers are busy
        assert proc.poll() is None
        time.sleep(0.05)
    children = _descendants(proc.pid)
    assert sum(name.startswith("python") for name in children.values()) >= 2, children
    proc.send_signal(signum)
    proc.wait()
    _assert_all_gone(children)


@pytest.mark.usefixtures("fresh_cache")
def test_killed_during_the_binding_compile_leaves_no_compiler(tmp_path, fixture_tree):
    proc = _start(tmp_path, fixture_tree)
    children = _wait_for(proc, {"cc1plus"})
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _assert_all_gone(children)
