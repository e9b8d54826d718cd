"""Reason codes are defined once (fa_attn/reasons.py): docs/reasons.md lists the same codes in the same
order with the same givers, and every code the sources raise is registered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fa_attn.reasons import CODES, Reason

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `(?P<code>[a-z0-9-]+)` \| (?P<given_by>[^|]+) \|")


def test_the_docs_table_is_the_codes_table() -> None:
    rows = [m for line in (REPO / "docs" / "reasons.md").read_text().splitlines() if (m := ROW.match(line))]
    assert [m["code"] for m in rows] == list(CODES)
    assert [m["given_by"].strip() for m in rows] == [given_by for given_by, _ in CODES.values()]


def test_every_code_the_sources_raise_is_registered() -> None:
    raised = set()
    for path in [*(REPO / "kernels").rglob("*.py"), *(REPO / "buildtool").rglob("*.py")]:
        raised |= set(re.findall(r'Reason\(\s*"([a-z0-9-]+)"', path.read_text()))
    assert raised, "the pattern finds nothing: the way reasons are raised changed"
    assert raised <= set(CODES)


def test_an_unregistered_code_is_refused() -> None:
    with pytest.raises(ValueError, match="not registered"):
        Reason("made-up", "message", "fix")
