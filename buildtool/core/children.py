"""Child processes that die with fa: a killed `fa build` (SIGTERM, SIGKILL, a closed terminal) leaves
no process behind.

Without this, the NVRTC worker processes (about 110 MB each) stayed blocked forever on their task pipe,
whose write end they hold themselves, and a g++ compile ran on to its end. On Linux the kernel is
asked to signal the child when its parent dies (prctl PR_SET_PDEATHSIG):

- a worker process calls `die_with_parent(parent_pid)` first thing (ProcessPoolExecutor's initializer);
- a command runs under `guarded(cmd)`: a small Python process that starts `cmd` in its own process
  group, and on its parent's death kills that whole group (g++ and the cc1plus/as/ld it runs), then
  exits.

The death signal follows the thread that started the child; fa starts them from threads that wait for
them, so it fires when the process dies. Elsewhere (macOS) both are no-ops beyond the parent check.

`read_capped` runs a command whose output fa reads (nvidia-smi) with a cap on its bytes and its time,
and kills its whole process group at the end: a hung wrapper script and the child it started go too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1


def _on_parent_death(signum: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def die_with_parent(parent_pid: int) -> None:
    """In a worker process: be killed when `parent_pid` dies, and exit now if it already has."""
    _on_parent_death(signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the request was in place
        os._exit(1)


# Runs `argv[2:]` in its own process group; SIGTERM (sent by the kernel when fa dies) or SIGHUP kill
# that group. Exit status: the command's, 127 if it cannot be started.
_GUARD = """
import ctypes, os, signal, subprocess, sys
proc = None
stopping = False
def stop(signum, frame):
    global stopping
    stopping = True
    if proc is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        os._exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGHUP, stop)
if sys.platform.startswith("linux"):
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
try:
    proc = subprocess.Popen(sys.argv[2:], start_new_session=True)
except OSError as e:
    sys.stderr.write("cannot run %s: %s\\n" % (sys.argv[2], e.strerror))
    sys.exit(127)
if stopping:
    stop(signal.SIGTERM, None)
sys.exit(proc.wait())
"""


def guarded(cmd: list[str]) -> list[str]:
    """`cmd` wrapped so that it, and every process it starts, is killed when this process dies."""
    return [sys.executable, "-I", "-S", "-c", _GUARD, str(os.getpid()), *cmd]


def read_capped(cmd: list[str], max_bytes: int, timeout_s: float) -> tuple[int | None, bytes]:
    """Run `cmd` (stdin and stderr closed) in its own process group and read at most `max_bytes` of its
    output within `timeout_s` seconds; then the whole group is killed, so a wrapper script that hangs,
    and the command it started, are both gone. Returns (exit status, None when it was cut off; output).
    Raises OSError when it cannot be started."""
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert proc.stdout is not None
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    finished = False
    try:
        fd = proc.stdout.fileno()
        while len(out) <= max_bytes:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                finished = True
                break
            out += chunk
    finally:
        if not finished or len(out) > max_bytes:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()
        try:
            status = proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 1)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            finished = False
    # The group is killed even after a clean exit: a child the command left behind has no reason to run.
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    if not finished or len(out) > max_bytes:
        return None, bytes(out[:max_bytes])
    return status, bytes(out)
