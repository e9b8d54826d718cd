"""index.json is read from a folder or a server fa does not control: an entry must describe its own
file (name, version, variant, CPU, CUDA major, torch, C++ ABI tell one story) or it is refused, naming
the field. Otherwise doctor would pick, for torch 2.12, a wheel built for 2.13."""

from __future__ import annotations

import pytest

from buildtool.compat.wheel_index import WheelIndexError, entry_from_dict
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
    assert f"wheels[0].{field}:" in str(err.value) and "fa index" in str(err.value)


def test_the_universal_wheel_names_no_torch():
    with pytest.raises(WheelIndexError, match=r"wheels\[1\]\.torch: '2.13' in the universal wheel"):
        entry_from_dict({**universal_entry(), "torch": "2.13"}, "index.json: wheels[1]")


def test_consistent_entries_are_read():
    for entry in (kernel_entry(12, "2.13", True), kernel_entry(12, "2.5", False), universal_entry()):
        assert entry_from_dict(entry, "index.json").file == entry["file"]
