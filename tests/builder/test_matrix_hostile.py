"""matrix.yaml is a total parser: whatever the file holds, `fa build` answers with a plan or with its
own error (exit 2) naming the file, the field and the fix in a message of a few lines, never a
traceback; and whatever it accepts can be planned against PyPI's torch releases."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from hypothesis import example, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from buildtool.builder.matrix import Matrix, load_matrix, parse_matrix
from buildtool.builder.plan import make_plan
from buildtool.builder.pypi import catalog_from_simple_json
from buildtool.cli import app
from tests.hostile import (
    NASTY_STRINGS,
    damaged_text,
    fa_errors_only,
    fa_errors_only_from_file,
    json_values,
    mutated,
)

REPO = Path(__file__).resolve().parents[2]
CATALOG = catalog_from_simple_json(
    json.loads((Path(__file__).parent / "data" / "torch_simple.json").read_text())
)
VALID = {
    "version": "0.1.0",
    "torch": ["2.5", "2.9"],
    "cuda": [12, 13],
    "python": ["3.11", "3.13t"],
    "platforms": ["x86_64"],
    "archs": {"12": ["8.0", "9.0"]},
    "ptx": {"13": "9.0"},
    "cxx11abi": "auto",
    "exclude": [{"torch": "<2.9", "cuda": 13}],
    "kernels": {"dtypes": ["bf16"], "head_dims": [128], "directions": ["fwd"]},
}
# Things YAML can say that JSON cannot: anchors and aliases, tags, other scalars.
YAML_SPECIALS = [
    "a: &x [1, 2]\nb: *x\n",
    "torch: !!python/object:os.system [ls]\n",
    "torch: !!binary aGVsbG8=\n",
    "cuda: [0o14, 0x0c, 1_2]\n",
    "torch: [2.10]\ncuda: [12]\npython: [3.10]\n",
    "torch: ['2.5']\ntorch: ['2.6']\ncuda: [12]\npython: ['3.12']\n",  # a duplicate key
    "? [a, b]\n: c\n",
    "torch: " + "9" * 5000 + "\n",
    "%YAML 1.1\n---\n{}\n...\n---\n{}\n",
]
# A few hundred bytes that expand to 9**9 references (a 259-byte one printed a 39 MB error in 32 s).
ALIAS_BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    + "torch: *i\ncuda: [12]\npython: ['3.12']\n"
)


def _plan(text: str) -> None:
    matrix = fa_errors_only(lambda: parse_matrix(text, "m.yaml"))
    if isinstance(matrix, Matrix):
        fa_errors_only(lambda: make_plan(matrix, CATALOG))


@given(mutated(VALID, json_values | st.sampled_from(NASTY_STRINGS)))
@example({**VALID, "torch": ["٢.٥"]})  # Arabic-Indic digits: \d matches them, Version() does not
@example({**VALID, "archs": {"¹²": ["8.0"]}})  # superscripts: isdigit() says yes, int() says no
@example({**VALID, "exclude": [{"torch": ">=" + "9" * 5000}]})
@example({**VALID, "version": "1." + "0" * 5000})
def test_a_mutated_matrix_is_planned_or_refused(doc):
    _plan(yaml.safe_dump(doc, allow_unicode=True))


@given(st.sampled_from(YAML_SPECIALS) | st.text(max_size=200))
@example(ALIAS_BOMB)
@example("- " * 3_000)
@example("[" * 1_500)
def test_any_yaml_text_is_planned_or_refused(text):
    _plan(text)


@given(damaged_text(yaml.safe_dump(VALID)))
def test_a_damaged_matrix_file_is_planned_or_refused(data):
    matrix = fa_errors_only_from_file("matrix.yaml", data, load_matrix)
    if isinstance(matrix, Matrix):
        fa_errors_only(lambda: make_plan(matrix, CATALOG))


def test_the_alias_bomb_is_answered_in_a_short_message_at_once(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(ALIAS_BOMB)
    assert len(ALIAS_BOMB) < 500
    t0 = time.monotonic()
    result = CliRunner().invoke(app, ["build", "--dry-run", "-m", str(path)])
    assert time.monotonic() - t0 < 5
    assert result.exit_code == 2, result.output[:500]
    assert len(result.output) < 1000, result.output[:500]
    assert "torch" in result.output
    assert "fix:" in result.output


def test_a_duplicate_key_is_named_with_both_lines(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("torch: ['2.5']\ncuda: [12]\npython: ['3.12']\ntorch: ['2.6']\n")
    result = CliRunner().invoke(app, ["build", "--dry-run", "-m", str(path)])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "torch: given twice (lines 1 and 4)" in said
    assert "fix:" in said


def test_special_and_odd_files_are_refused_with_their_name(tmp_path):
    import os

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    utf16 = tmp_path / "utf16.yaml"
    utf16.write_bytes((REPO / "matrix.yaml").read_text().encode("utf-16"))
    for path, said in (
        (Path("/dev/zero"), "not a regular file"),
        (fifo, "not a regular file"),
        (tmp_path, "not a regular file"),
        (utf16, "UTF-16"),
    ):
        result = CliRunner().invoke(app, ["build", "--dry-run", "-m", str(path)])
        assert result.exit_code == 2, result.output
        assert str(path) in result.output
        assert said in result.output
