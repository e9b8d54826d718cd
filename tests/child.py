"""A child process as the tests run one: its output captured as text, a non-zero exit returned rather than
raised (the test asserts on the code with the child's stderr beside it), and a time limit so a hung child
fails its test instead of the whole run."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_child(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )
