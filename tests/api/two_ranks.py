"""Run a two-rank script of tests/api (ring_ranks.py, tp_ranks.py): two gloo ranks on 127.0.0.1 with this
checkout's fa_attn, and the "CASE <name> <numbers...>" lines they print."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    """A free TCP port on 127.0.0.1, for the gloo ranks' rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(script: str) -> dict[str, list[str]]:
    """Run a two-rank script of this folder (ring_ranks.py, tp_ranks.py) with this checkout's fa_attn:
    its "CASE <name> <numbers...>" lines, by name (empty, with the script's stderr tail, on a failure)."""
    paths = [str(HERE.parents[1] / "kernels"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    result = subprocess.run(
        [sys.executable, "-W", "ignore", str(HERE / script), str(free_port())],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    cases = {
        line.split()[1]: line.split()[2:] for line in result.stdout.splitlines() if line.startswith("CASE ")
    }
    if not cases:
        cases["stderr"] = [result.stderr[-3000:]]
    return cases
