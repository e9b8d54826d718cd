"""PyPI's torch catalog for tests that plan the release matrix offline: the fixture of the plan tests
(tests/builder/data/torch_simple.json), which keeps a few versions only (make_torch_fixture.py) and so
lacks torch 2.11; 2.11.0 is added with 2.10.0's files renamed, so matrices listing every minor plan as
they do online."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "builder" / "data" / "torch_simple.json"


def simple_json() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DATA.read_text())
    minors = {m.group(1) for f in data["files"] if (m := re.match(r"torch-(\d+\.\d+)\.", f["filename"]))}
    if "2.11" not in minors:
        copies = [f for f in data["files"] if f["filename"].startswith("torch-2.10.0-")]
        data["files"] += [{**f, "filename": f["filename"].replace("2.10.0", "2.11.0")} for f in copies]
    return data
