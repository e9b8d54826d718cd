"""index.json is a total parser: whatever a folder or a server hands fa as index.json, doctor and
install answer with a choice or with fa's own error (exit 2) naming the entry, the field and the fix,
never a traceback; and whatever it accepts, the choice and the report can be made from."""

from __future__ import annotations

import io
import json
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st
from rich.console import Console

from buildtool.compat.choose import Request
from buildtool.compat.doctor import build_report, render, report_json
from buildtool.compat.env import env_from_json
from buildtool.compat.wheel_index import WheelIndex, load_index
from tests.hostile import damaged_text, fa_errors_only_from_file, json_values, mutated
from tests.select.fixture_index import kernel_entry, universal_entry

ENVS = Path(__file__).parent / "envs"
MACHINES = [
    env_from_json(json.loads((ENVS / name).read_text())["env"])
    for name in ("a100-ngc-24.10.json", "cpu-only-torch.json", "driver470-cu12-wheels-only.json")
]
VALID = {
    "schema": 1,
    "package": "fa-attn",
    "wheels": [kernel_entry(12, "2.5", False), kernel_entry(13, "2.9", True), universal_entry()],
}


def _choose_from(index: WheelIndex) -> None:
    for env in MACHINES:
        report = build_report(env, index, Request("bf16", 128, True))
        json.dumps(report_json(report))
        render(report, Console(file=io.StringIO(), width=100))


def _load(data: bytes) -> WheelIndex | object:
    return fa_errors_only_from_file("index.json", data, lambda path: load_index(str(path.parent)))


@given(mutated(VALID))
@example({**VALID, "wheels": [{**kernel_entry(12, "2.5", False), "sha256": "A" * 64}]})
@example({**VALID, "wheels": [{**kernel_entry(12, "2.5", False), "requires_python": "py3.9+"}]})
@example({**VALID, "wheels": [{**kernel_entry(12, "2.5", False), "coverage": [{"arch": "sm_x"}]}]})
@example({**VALID, "wheels": [{**kernel_entry(12, "2.5", False), "min_driver": "5" * 5000}]})
@example({**VALID, "wheels": [{**kernel_entry(12, "2.5", False), "size": -1}]})
def test_a_mutated_index_is_chosen_from_or_refused(doc):
    index = _load(json.dumps(doc).encode())
    if isinstance(index, WheelIndex):
        _choose_from(index)


@given(json_values)
def test_any_json_value_is_chosen_from_or_refused(value):
    try:
        text = json.dumps(value)
    except ValueError:
        return
    index = _load(text.encode())
    if isinstance(index, WheelIndex):
        _choose_from(index)


@given(damaged_text(json.dumps(VALID)) | st.binary(max_size=300))
@example(b"[" * 100_000)
@example(b'{"schema": 1, "wheels": [' + b"9" * 5000 + b"]}")
@example(json.dumps(VALID).encode("utf-16"))
def test_a_damaged_index_file_is_chosen_from_or_refused(data):
    index = _load(data)
    if isinstance(index, WheelIndex):
        _choose_from(index)
