"""The pre-commit hooks run exactly the checks .ci/run runs (the same commands), so a developer's
commit meets what CI asks."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_the_hooks_are_ci_checks() -> None:
    ci = [
        line.split("#")[0].strip()
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.startswith("python3 -m ") and " pip install " not in line
    ]
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = [hook["entry"] for repo in config["repos"] for hook in repo["hooks"]]
    assert ci, "no check found in .ci/run: the way it runs them changed"
    assert hooks == ci
