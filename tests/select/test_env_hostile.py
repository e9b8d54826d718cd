"""The environment description (`fa doctor --env FILE`) is a total parser: whatever the file holds, fa
answers with a report or with its own error (exit 2) naming the field and the fix, never a traceback;
and whatever it accepts, doctor can report on."""

from __future__ import annotations

import io
import json
from pathlib import Path

from hypothesis import example, given
from rich.console import Console

from buildtool.commands.doctor import _load_env
from buildtool.compat.choose import Request
from buildtool.compat.doctor import build_report, render, report_json
from buildtool.compat.env import Env, env_from_json
from buildtool.compat.wheel_index import WheelIndex, entry_from_dict
from tests.hostile import damaged_text, fa_errors_only, fa_errors_only_from_file, json_values, mutated
from tests.select.fixture_index import fixture_index

ENVS = Path(__file__).parent / "envs"
VALID = json.loads((ENVS / "a100-ngc-24.10.json").read_text())["env"]
INDEX = WheelIndex(
    "fixture", tuple(entry_from_dict(w, f"wheels[{i}]") for i, w in enumerate(fixture_index()["wheels"]))
)


def _report_on(env: Env) -> None:
    """Everything doctor does with an accepted env: choose, and print as JSON and as a table."""
    for request in (Request(), Request("fp16", 72, True)):
        report = build_report(env, INDEX, request)
        json.dumps(report_json(report))
        console = Console(file=io.StringIO(), width=100)
        render(report, console)
        assert "\x1b" not in console.file.getvalue()  # type: ignore[attr-defined]


@given(mutated(VALID))
@example({**VALID, "glibc": "2." + "9" * 30})  # used to loop over every glibc minor below it
@example({**VALID, "python": "3.١١"})  # Arabic-Indic digits
@example({**VALID, "gpus": [{"name": "GPU\x1b[2J", "sm": "8.0", "memory_mib": 1}]})
@example({**VALID, "gpus": [{"name": "A100", "sm": "8.0", "memory_mib": -1}]})
@example({**VALID, "driver": {"version": "5" * 5000}})
@example({**VALID, "gpus": [{"name": "A100", "sm": "99999999999999999999.0", "memory_mib": 1}]})
@example({**VALID, "gpus": [{"name": "A100", "sm": "8.0", "memory_mib": 1, "smem_per_block": 1}]})
@example({**VALID, "gpus": [{"name": "A100", "sm": "8.0", "memory_mib": 1, "smem_per_block": 1 << 24}]})
def test_a_mutated_env_is_reported_or_refused(doc):
    env = fa_errors_only(lambda: env_from_json(doc))
    if isinstance(env, Env):
        _report_on(env)


@given(json_values)
def test_any_json_value_is_reported_or_refused(value):
    env = fa_errors_only(lambda: env_from_json(value))
    if isinstance(env, Env):
        _report_on(env)


@given(damaged_text(json.dumps(VALID)))
@example(b"[" * 100_000)
@example(b"9" * 5000)
@example(json.dumps(VALID).encode("utf-16"))
def test_a_damaged_env_file_is_reported_or_refused(data):
    env = fa_errors_only_from_file("env.json", data, _load_env)
    if isinstance(env, Env):
        _report_on(env)


def test_special_files_are_refused_with_their_name(tmp_path):
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path in (Path("/dev/zero"), fifo, tmp_path, tmp_path / "missing.json"):
        error = fa_errors_only(lambda p=path: _load_env(p))
        assert not isinstance(error, Env)
        assert str(path) in str(error)


def test_a_gpu_s_shared_memory_is_a_positive_byte_count() -> None:
    """gpus[i].smem_per_block decides the tiles: anything but a positive integer (up to 16 MiB) is
    refused, naming the field and where the figure comes from."""
    for bad in (True, -1, 0, "101376", 1.5, (1 << 24) + 1):
        gpu = {"name": "RTX 3090", "sm": "8.6", "memory_mib": 24576, "smem_per_block": bad}
        error = fa_errors_only(lambda g=gpu: env_from_json({**VALID, "gpus": [g]}))
        assert not isinstance(error, Env), bad
        assert "gpus[0].smem_per_block" in str(error)
        assert "shared_memory_per_block_optin" in str(error)
    gpu = {"name": "RTX 3090", "sm": "8.6", "memory_mib": 24576, "smem_per_block": 101376}
    assert env_from_json({**VALID, "gpus": [gpu]}).gpus[0].smem_per_block == 101376
