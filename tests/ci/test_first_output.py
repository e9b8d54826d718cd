"""Every command says what it is doing before its first slow step (issue 37: `fa build --dry-run` was
silent for 16 s, `fa index` for 9 s). Checked by the order of events in the real command, not by
timing: an audit hook (sys.addaudithook) in the child logs each write to stdout/stderr and the first
slow step (loading the build pipeline, the probe and rules, torch or fa_attn; starting a process;
opening a socket; reading a wheel), then ends the child there, so the test waits for no slow step.
bench/install/first_output.py measures the seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.commands import install

REPO = Path(__file__).resolve().parents[2]

WATCHED = r"""
import io, json, os, sys

LOG, SLOW = os.environ["FA_TEST_EVENTS"], tuple(os.environ["FA_TEST_SLOW"].split(","))
events = []


def done(what):
    events.append(["slow", what])
    with open(LOG, "w") as f:
        json.dump(events, f)
    os._exit(0)


def hook(event, args):
    if event == "import" and args[0].startswith(SLOW):
        done(args[0])
    elif event in ("subprocess.Popen", "socket.connect"):
        done(event)
    elif event == "open" and isinstance(args[0], str) and args[0].endswith(".whl"):
        done(args[0])


class Watched(io.TextIOBase):
    def __init__(self, name, stream):
        self._name, self._stream = name, stream

    def write(self, text):
        if text:
            events.append([self._name, text])
        return self._stream.write(text)

    def __getattr__(self, attr):
        return getattr(self._stream, attr)


sys.stdout, sys.stderr = Watched("stdout", sys.stdout), Watched("stderr", sys.stderr)
sys.addaudithook(hook)
sys.argv = ["fa", *sys.argv[1:]]
from buildtool import cli

try:
    cli.main()
finally:
    with open(LOG, "w") as f:
        json.dump(events, f)
"""


def _events(args: list[str], slow: tuple[str, ...], cwd: Path, tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "events.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "kernels")]),
        "FA_TEST_EVENTS": str(log),
        "FA_TEST_SLOW": ",".join(slow),
    }
    subprocess.run([sys.executable, "-c", WATCHED, *args], cwd=cwd, env=env, capture_output=True, check=False)
    events: list[list[str]] = json.loads(log.read_text())
    return events


def _wheel_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / "fa_attn-0.1.0-py3-none-any.whl").write_bytes(b"not read before the first line")
    (folder / "index.json").write_text(json.dumps({"schema": 1, "wheels": []}))
    return folder


@pytest.mark.parametrize(
    ("args", "slow", "says"),
    [
        (["build", "--dry-run"], ("buildtool.builder",), "fa build: planning the wheels of matrix.yaml"),
        (["build", "--dry-run", "--local"], ("buildtool.builder",), "fa build: planning the installed torch"),
        (["index", "WHEELS"], ("buildtool.builder",), "fa index: reading and checking the wheels in"),
        (["doctor", "--wheels", "WHEELS"], ("buildtool.compat",), "fa doctor: probing this machine"),
        (["doctor", "--json", "--wheels", "WHEELS"], ("buildtool.compat",), "fa doctor: probing"),
        (["install", "--dry-run", "--wheels", "WHEELS"], ("buildtool.compat",), "fa install: probing"),
        (["check"], ("fa_attn", "torch"), "fa check: loading torch and fa_attn"),
    ],
)
def test_the_first_line_comes_before_the_first_slow_step(args, slow, says, tmp_path):
    wheels = _wheel_folder(tmp_path)
    events = _events([str(wheels) if a == "WHEELS" else a for a in args], slow, REPO, tmp_path)
    kinds = [kind for kind, _ in events]
    assert "slow" in kinds, events  # the command reached its slow step (so the order means something)
    first_slow = kinds.index("slow")
    said = [text for kind, text in events[:first_slow] if kind in ("stdout", "stderr")]
    assert said, f"nothing printed before {events[first_slow][1]}: {events}"
    assert "".join(said).startswith(says), said


def test_the_first_line_goes_to_stderr_so_json_stays_one_document(tmp_path):
    wheels = _wheel_folder(tmp_path)
    events = _events(["doctor", "--json", "--wheels", str(wheels)], ("buildtool.compat",), REPO, tmp_path)
    assert [kind for kind, _ in events[:1]] == ["stderr"], events


def test_install_wait_help_states_the_lock_wait():
    """--wait's help names the default without loading compat/install.py (see WAIT_HELP_MINUTES)."""
    from buildtool.compat.install import LOCK_WAIT_S

    assert install.WAIT_HELP_MINUTES * 60 == LOCK_WAIT_S
