"""index.json is read from a folder or a server fa does not control: an entry must describe its own
file (name, version, variant, CPU, CUDA major, torch, C++ ABI tell one story) or it is refused, naming
the field. Otherwise doctor would pick, for torch 2.12, a wheel built for 2.13."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from buildtool.cli import app
from buildtool.compat.wheel_index import WheelIndexError, entry_from_dict, load_index
from tests.select.fixture_index import kernel_entry, universal_entry


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"torch": "2.12"}, "torch"),
        ({"cuda_major": 13}, "cuda_major"),
        ({"cxx11abi": False}, "cxx11abi"),
        ({"version": "0.1.0+cu12torch2.12"}, "version"),
        ({"version": "0.2.0+cu12torch2.13"}, "version"),
        ({"variant": "cu12torch2.12"}, "variant"),
        ({"platform": "aarch64"}, "platform"),
        ({"file": "fa_attn-0.1.0+cu12torch2.12-py3-none-manylinux_2_28_x86_64.whl"}, "version"),
        ({"file": "fa_attn-0.1.0+cu12torch2.13-cp311-cp311-manylinux_2_28_x86_64.whl"}, "file"),
        ({"file": "other-0.1.0+cu12torch2.13-py3-none-manylinux_2_28_x86_64.whl"}, "file"),
        ({"file": "fa_attn-0.1.0+cu12torch2.13-py3-none-win_amd64.whl", "platform": None}, "file"),
    ],
)
def test_an_entry_that_contradicts_its_file_is_refused(change, field):
    entry = {**kernel_entry(12, "2.13", True), **change}
    with pytest.raises(WheelIndexError) as err:
        entry_from_dict(entry, "index.json: wheels[0]")
    assert f"wheels[0].{field}:" in str(err.value)
    assert "fa index" in str(err.value)


def test_the_universal_wheel_names_no_torch():
    with pytest.raises(WheelIndexError, match=r"wheels\[1\]\.torch: '2.13' in the universal wheel"):
        entry_from_dict({**universal_entry(), "torch": "2.13"}, "index.json: wheels[1]")


def test_consistent_entries_are_read():
    for entry in (kernel_entry(12, "2.13", True), kernel_entry(12, "2.5", False), universal_entry()):
        assert entry_from_dict(entry, "index.json").file == entry["file"]


def test_a_broken_entry_is_refused_by_name_not_dropped(tmp_path):
    """One unreadable entry used to vanish, and install quietly fell back to the universal wheel."""
    broken = {**kernel_entry(12, "2.13", True), "coverage": [{"arch": "8.0", "image": "cubin"}]}
    index = {"schema": 1, "package": "fa-attn", "wheels": [universal_entry(), broken]}
    (tmp_path / "index.json").write_text(json.dumps(index))
    for command in (["doctor"], ["install", "--dry-run"]):
        result = CliRunner().invoke(app, [*command, "--wheels", str(tmp_path)])
        assert result.exit_code == 2, result.output
        assert "wheels[1].coverage[0].image: got 'cubin'; expected sass or ptx" in result.output
        assert "fix: re-run fa index" in result.output


def test_a_downgrade_to_the_universal_wheel_is_said(tmp_path):
    index = {"schema": 1, "package": "fa-attn", "wheels": [kernel_entry(12, "2.4", False), universal_entry()]}
    (tmp_path / "index.json").write_text(json.dumps(index))
    result = CliRunner().invoke(app, ["install", "--wheels", str(tmp_path), "--dry-run", "--json"])
    out = json.loads(result.stdout)
    assert out["selected"] == universal_entry()["file"]
    assert "a downgrade" in out["downgrade"]
    assert "torch-version-mismatch" in out["downgrade"]
    text = CliRunner().invoke(app, ["install", "--wheels", str(tmp_path), "--dry-run"]).output
    assert "note: a downgrade" in " ".join(text.split())  # plain sentences, wrapped to the terminal


def test_an_upper_case_sha256_is_the_same_hash():
    entry = {**kernel_entry(12, "2.13", True), "sha256": "AB" * 32}
    assert entry_from_dict(entry, "index.json").sha256 == "ab" * 32


def test_a_requires_python_that_does_not_parse_is_refused_not_ignored():
    entry = {**kernel_entry(12, "2.13", True), "requires_python": "py3.9+"}
    with pytest.raises(WheelIndexError, match=r"wheels\[0\]\.requires_python: got 'py3\.9\+'"):
        entry_from_dict(entry, "index.json: wheels[0]")


def _local_build(sass: tuple[str, ...], ptx: str | None) -> dict:
    """A wheel `fa install --build` labelled for sm 8.0 whose manifest says `sass` and `ptx`."""
    label = "cu12torch2.10plus.local.sm80"
    entry = kernel_entry(12, "2.10", None, sass=("8.0",), ptx=None)
    file = entry["file"].replace("+cu12torch2.10plus", f"+{label}")
    return {
        **entry,
        "variant": label,
        "version": f"0.1.0+{label}",
        "file": file,
        "sass": list(sass),
        "ptx": ptx,
    }


def test_a_local_build_label_is_read():
    assert entry_from_dict(_local_build(("8.0",), None), "index.json").info.variant.endswith(".local.sm80")


@pytest.mark.parametrize(("sass", "ptx"), [(("8.0", "9.0"), None), (("9.0",), None), (("8.0",), "8.0")])
def test_a_local_build_label_holds_its_one_arch_alone(sass, ptx):
    with pytest.raises(WheelIndexError, match=r"wheels\[0\]\.sass: .*holds sm 80's SASS alone"):
        entry_from_dict(_local_build(sass, ptx), "index.json: wheels[0]")


def test_an_over_long_file_name_in_an_entry_is_quoted_short(tmp_path):
    """Round three: a 300-character file name in an index entry was quoted whole, twice."""
    from tests.select.fixture_index import fixture_index

    data = fixture_index()
    data["wheels"][0]["file"] = "a" * 300 + ".whl"
    (tmp_path / "index.json").write_text(json.dumps(data))
    with pytest.raises(WheelIndexError) as caught:
        load_index(str(tmp_path))
    assert caught.value.exit_code == 2
    assert "is not a wheel file name (Invalid wheel filename (wrong number of parts))" in str(caught.value)
    assert len(str(caught.value)) < 400
