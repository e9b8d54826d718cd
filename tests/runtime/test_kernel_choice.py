"""kernel_choice.choose over manifests built here: SASS/PTX ranges, driver floor, coverage gaps."""

from __future__ import annotations

import pytest
from fa_attn import kernel_choice
from fa_attn.kernel_choice import choose, kernel_entry

ALL_DIMS = list(range(8, 257, 8))
FWD_BWD = ("fwd", "bwd")


def cov(arch: str, image: str = "sass", dtypes=("fp16", "bf16"), directions=FWD_BWD, dims=ALL_DIMS) -> list:
    return [
        {"arch": arch, "image": image, "dtype": d, "direction": r, "head_dims": list(dims)}
        for d in dtypes
        for r in directions
    ]


def manifest(*coverage: list, ptx: str | None = None, ptx_min_driver: str | None = None) -> dict:
    return {
        "schema": 1,
        "cuda_major": 12,
        "binding": "libfa_attn_ops.so",
        "ptx": ptx,
        "ptx_min_driver": ptx_min_driver,
        "coverage": [c for group in coverage for c in group],
    }


# A cu12-like wheel: SASS 7.5 (fp16 only), 8.0, 8.6, 9.0, 10.0, 12.0 and PTX 12.0.
CU12 = manifest(
    cov("7.5", dtypes=("fp16",)),
    cov("8.0"),
    cov("8.6"),
    cov("9.0"),
    cov("10.0"),
    cov("12.0"),
    cov("12.0", image="ptx"),
    ptx="12.0",
    ptx_min_driver="575.51.03",
)


@pytest.mark.parametrize(
    ("sm", "path", "arch"),
    [
        ("7.5", "sass", "7.5"),
        ("8.0", "sass", "8.0"),
        ("8.6", "sass", "8.6"),
        ("8.7", "sass", "8.6"),  # Orin: highest minor <= device's within the major
        ("8.9", "sass", "8.6"),  # L4/L40: sm_86 SASS runs on 8.9
        ("9.0", "sass", "9.0"),
        ("10.0", "sass", "10.0"),
        ("12.0", "sass", "12.0"),
        ("12.1", "sass", "12.0"),
        ("13.0", "ptx", "12.0"),  # no SASS of major 13: JIT the newest PTX <= device
    ],
)
def test_range_choice(sm: str, path: str, arch: str) -> None:
    choice = choose(CU12, sm, "fp16", 128, backward=True, driver=None)
    assert (choice.path, choice.arch, choice.head_dim, choice.reasons) == (path, arch, 128, ())


def test_sm70_has_no_kernel() -> None:
    choice = choose(CU12, "7.0", "fp16", 64, backward=False, driver="580.65.06")
    assert choice.path == "fallback"
    assert [r.code for r in choice.reasons] == ["arch-unsupported"]
    assert "7.0" in choice.reasons[0].message and choice.reasons[0].fix


def test_sass_never_crosses_majors() -> None:
    only80 = manifest(cov("8.0"))
    assert choose(only80, "9.0", "bf16", 64, False, None).reasons[0].code == "arch-unsupported"
    assert choose(only80, "8.9", "bf16", 64, False, None).arch == "8.0"


def test_ptx_needs_a_new_enough_driver() -> None:
    old = choose(CU12, "13.0", "bf16", 128, backward=False, driver="550.54.15")
    assert old.path == "fallback"
    assert [r.code for r in old.reasons] == ["ptx-driver-too-old"]
    assert "575.51.03" in old.reasons[0].message and "550.54.15" in old.reasons[0].message
    new = choose(CU12, "13.0", "bf16", 128, backward=False, driver="580.65.06")
    assert (new.path, new.arch) == ("ptx", "12.0")


def test_old_driver_does_not_matter_when_sass_fits() -> None:
    assert choose(CU12, "9.0", "bf16", 128, False, driver="525.60.13").path == "sass"


def test_ptx_newer_than_device_is_not_used() -> None:
    ptx_only = manifest(cov("9.0", image="ptx"), ptx="9.0", ptx_min_driver="550.54.15")
    assert choose(ptx_only, "8.6", "fp16", 64, False, None).reasons[0].code == "arch-unsupported"
    assert choose(ptx_only, "10.0", "fp16", 64, False, None).path == "ptx"


@pytest.mark.parametrize("dtype", ["bf16", "bfloat16", "torch.bfloat16"])
def test_bf16_on_turing(dtype: str) -> None:
    choice = choose(CU12, "7.5", dtype, 64, backward=False, driver=None)
    assert [r.code for r in choice.reasons] == ["dtype-unsupported"]


def test_fp32_anywhere_is_unsupported() -> None:
    for sm in ("7.5", "8.0", "9.0"):
        assert choose(CU12, sm, "fp32", 64, False, None).reasons[0].code == "dtype-unsupported"


def test_head_dim_gaps() -> None:
    assert choose(CU12, "9.0", "fp16", 512, False, None).reasons[0].code == "head-dim-unsupported"
    small = manifest(cov("8.0", dims=[32, 64, 128]))
    assert choose(small, "8.0", "fp16", 96, False, None).reasons[0].code == "head-dim-unsupported"
    padded = choose(small, "8.0", "fp16", 60, False, None)  # 60 pads to 64, which is covered
    assert (padded.path, padded.head_dim) == ("sass", 64)


def test_backward_gap() -> None:
    fwd_only_256 = manifest(
        cov("8.6", dims=ALL_DIMS, directions=("fwd",)), cov("8.6", dims=range(8, 129, 8), directions=("bwd",))
    )
    assert choose(fwd_only_256, "8.6", "bf16", 256, backward=False, driver=None).path == "sass"
    choice = choose(fwd_only_256, "8.6", "bf16", 256, backward=True, driver=None)
    assert [r.code for r in choice.reasons] == ["backward-unsupported"]
    assert choose(fwd_only_256, "8.6", "bf16", 128, backward=True, driver=None).path == "sass"


def test_lower_minor_sass_fills_a_gap_of_the_best_one() -> None:
    mixed = manifest(cov("8.0"), cov("8.6", dims=[64]))
    assert choose(mixed, "8.6", "fp16", 128, False, None).arch == "8.0"


def test_no_gpu_and_universal() -> None:
    assert choose(CU12, None, "bf16", 128, False, None).reasons[0].code == "no-gpu"
    universal = {"cuda_major": None, "binding": None, "coverage": []}
    assert choose(universal, "9.0", "bf16", 128, False, None).reasons[0].code == "binding-unavailable"


def test_index_json_entry_works() -> None:
    entry = {k: v for k, v in CU12.items() if k != "binding"}  # index.json has no "binding" field
    entry["file"] = "fa_attn-1.0.0+cu12torch2.5-py3-none-manylinux_2_28_x86_64.whl"
    assert choose(entry, "9.0", "bf16", 128, True, None).path == "sass"


def test_bad_values_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="dtype"):
        choose(CU12, "9.0", "int8", 128, False, None)
    with pytest.raises(ValueError, match="sm"):
        choose(CU12, "hopper", "bf16", 128, False, None)
    with pytest.raises(ValueError, match="driver"):
        choose(CU12, "13.0", "bf16", 128, False, "latest")
    assert kernel_choice.parse_arch("sm_86") == (8, 6)
    assert kernel_choice.parse_arch("120") == (12, 0)


def test_kernel_entry_picks_smallest_bucket() -> None:
    man = dict(
        manifest(cov("8.0", dims=range(8, 129, 8))),
        kernels=[
            {
                "arch": "8.0",
                "image": "sass",
                "dtype": "bf16",
                "direction": "fwd",
                "head_dim": hd,
                "file": f"{hd}",
            }
            for hd in (128, 64, 32)
        ],
    )
    choice = choose(man, "8.0", "bf16", 40, False, None)
    assert kernel_entry(man, choice, "bf16", "fwd")["head_dim"] == 64
    assert kernel_entry(man, choice, "bf16", "bwd") is None


def test_buildtool_loads_the_same_file() -> None:
    from buildtool.core import kernels_src

    shared = kernels_src.kernel_choice()
    assert shared.choose(CU12, "8.9", "fp16", 64, False, None).arch == "8.6"
