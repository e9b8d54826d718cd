"""The manifest and index.json schema (fa_attn/schema.py): each minor's fields are pinned here, so a
field cannot be added without raising the version; readers take every minor and refuse another major."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fa_attn import schema
from fa_attn.schema import IndexEntry, Manifest, SchemaError, WheelInfo, read_index

# The keys each minor added, per part. Adding a field: raise SCHEMA_MINOR and add a line here.
ADDED = {
    0: {
        "WheelInfo": {
            "version", "variant", "platform", "cuda_major", "toolkit", "min_driver", "ptx_min_driver",
            "sass", "ptx", "torch", "cxx11abi", "coverage",
        },
        "Manifest": {"kernels"},
        "IndexEntry": {"file", "sha256", "size", "python_tag", "abi_tag", "platform_tag", "requires_python"},
        "Coverage": {"arch", "image", "dtype", "direction", "head_dims"},
        "KernelFile": {"arch", "image", "file", "unit", "direction", "dtype", "head_dim", "entries"},
        "Launch": {"threads", "block_m", "block_n", "smem_bytes", "grid"},
    },
    1: {"WheelInfo": {"binding", "features"}, "Coverage": {"smem_bytes"}},
    2: {"WheelInfo": {"binding_form", "torch_tested"}, "Manifest": {"source_sha256"}},
    3: {
        "WheelInfo": {"bindings", "kernel_sets"}, "KernelFile": {"cuda_major"},
        "BindingFile": {"file", "torch", "cxx11abi", "binding_form", "torch_tested"},
        "KernelSet": {"cuda_major", "toolkit", "min_driver", "ptx_min_driver", "sass", "ptx", "coverage"},
    },
    4: {
        "WheelInfo": {"arch_specific", "arch_specific_features"}, "KernelFile": {"arch_specific"},
        "Coverage": {"arch_specific"}, "KernelSet": {"arch_specific", "arch_specific_features"},
    },
}  # fmt: skip
PARTS = (
    WheelInfo, Manifest, IndexEntry, schema.Coverage, schema.KernelFile, schema.Launch, schema.BindingFile,
    schema.KernelSet,
)  # fmt: skip
# Parts first written in a later minor: their fields are required from it (no older file has them).
NEW_PARTS = {"BindingFile": 3, "KernelSet": 3}


def keys(part: type) -> dict[str, int]:
    """A part's JSON keys and the minor that added each (a WheelInfo field stands for its keys)."""
    out = {}
    for f in dataclasses.fields(part):
        if "flat" not in f.metadata:
            out[f.name] = f.metadata["since"]
    return out


@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.__name__)
def test_each_minor_pins_its_fields(part: type) -> None:
    pinned = {key: minor for minor, added in ADDED.items() for key in added.get(part.__name__, ())}
    assert keys(part) == pinned
    assert max(ADDED) == schema.SCHEMA_MINOR


def test_a_field_added_after_the_first_minor_has_a_value_for_older_files() -> None:
    for part in PARTS:
        for f in dataclasses.fields(part):
            if f.metadata.get("since", 0) > NEW_PARTS.get(part.__name__, 0):
                assert f.metadata["absent"] is not schema._REQUIRED, f"{part.__name__}.{f.name}"


def _manifest() -> Manifest:
    coverage = schema.Coverage("8.0", "sass", "bf16", "fwd", (72, 80), 49152)
    launch = schema.Launch(128, 128, 64, 49152, "q_blocks")
    kernel = schema.KernelFile(
        "8.0",
        "sass",
        "kernels/sm_80/fwd_bf16_d80.cubin",
        "fwd_bf16_d80",
        "fwd",
        "bf16",
        80,
        {"fa_fwd": launch},
    )
    info = dataclasses.replace(
        schema.universal_info("0.1.0+cu12torch2.8"),
        variant="cu12torch2.8",
        cuda_major=12,
        torch="2.8",
        sass=("8.0",),
        binding=schema.BINDING_FILE,
        coverage=(coverage,),
    )
    return Manifest(info=info, kernels=(kernel,))


def test_a_manifest_survives_json() -> None:
    man = _manifest()
    data = json.loads(json.dumps(man.to_json()))
    assert (data["schema"], data["schema_minor"], data["package"]) == (1, schema.SCHEMA_MINOR, "fa-attn")
    assert Manifest.from_json(data) == man


def test_an_index_entry_repeats_the_manifests_info() -> None:
    man = _manifest()
    entry = IndexEntry(
        file="fa_attn-0.1.0+cu12torch2.8-py3-none-manylinux_2_28_x86_64.whl",
        sha256="0" * 64,
        size=1,
        info=man.info,
        python_tag="py3",
        abi_tag="none",
        platform_tag="manylinux_2_28_x86_64",
        requires_python=">=3.9",
    )
    data = json.loads(json.dumps(schema.index_json([entry])))
    assert "kernels" not in data["wheels"][0]
    assert read_index(data) == (entry,)


def test_an_older_minor_reads_with_the_values_it_lacked() -> None:
    data = _manifest().to_json()
    data["schema_minor"] = 0
    for key in ("binding", "features"):
        del data[key]
    del data["coverage"][0]["smem_bytes"]
    info = Manifest.from_json(data).info
    assert (info.binding, info.features, info.coverage[0].smem_bytes) == (None, (), None)


def test_unknown_keys_are_ignored() -> None:
    data = dict(_manifest().to_json(), schema_minor=99, added_later="x")
    assert Manifest.from_json(data) == _manifest()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"schema": 2}, "upgrade fa-toolchain"),
        ({"schema": 0}, "rebuild it"),
        ({"schema": True}, "rebuild it"),
        ({"cuda_major": "12"}, "cuda_major: got '12'; expected an integer"),
        ({"cxx11abi": 1}, "cxx11abi: got 1; expected true or false"),
        ({"sass": "8.0"}, "sass: got '8.0'; expected a list"),
        ({"version": None}, "version: got None; expected a string"),
    ],
)
def test_a_bad_manifest_names_the_field(change: dict, says: str) -> None:
    with pytest.raises(SchemaError, match=says):
        Manifest.from_json(dict(_manifest().to_json(), **change))


def test_a_bad_row_names_its_place() -> None:
    data = _manifest().to_json()
    data["kernels"][0]["entries"]["fa_fwd"]["threads"] = "128"
    with pytest.raises(SchemaError, match=r"^kernels\[0\]\.entries\.fa_fwd\.threads: got '128'"):
        Manifest.from_json(data)
    del data["version"]
    with pytest.raises(SchemaError, match=r"^version: missing"):
        Manifest.from_json(data)


@pytest.mark.parametrize("name", ["../../evil.whl", "sub/dir.whl", "fa_attn.tar.gz", ".hidden.whl"])
def test_an_index_entry_names_a_wheel_beside_the_index(name: str) -> None:
    with pytest.raises(SchemaError, match=r"wheels\[0\]\.file"):
        read_index({"schema": 1, "wheels": [{"file": name, "sha256": "0", "version": "0.1.0"}]})
