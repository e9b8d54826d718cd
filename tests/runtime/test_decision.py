"""decision.decide over manifests built here: SASS/PTX ranges, driver floor, coverage gaps, shared
memory, kernel files."""

from __future__ import annotations

from pathlib import Path

import pytest
from fa_attn import versions
from fa_attn.reasons import Reason
from fa_attn.runtime.decision import Call, Device, Dispatch, decide
from fa_attn.schema import Manifest, WheelInfo

ALL_DIMS = list(range(8, 257, 8))
FWD_BWD = ("fwd", "bwd")


def cov(arch: str, image: str = "sass", dtypes=("fp16", "bf16"), directions=FWD_BWD, dims=ALL_DIMS) -> list:
    return [
        {"arch": arch, "image": image, "dtype": d, "direction": r, "head_dims": list(dims)}
        for d in dtypes
        for r in directions
    ]


def manifest(*coverage: list, ptx: str | None = None, ptx_min_driver: str | None = None, **more) -> Manifest:
    return Manifest.from_json(
        {
            "schema": 1,
            "version": "0.1.0",
            "cuda_major": 12,
            "binding": "libfa_attn_ops.so",
            "ptx": ptx,
            "ptx_min_driver": ptx_min_driver,
            "coverage": [c for group in coverage for c in group],
            **more,
        }
    )


def info(*coverage: list, **fields) -> WheelInfo:
    return manifest(*coverage, **fields).info


def choose(
    wheel: WheelInfo, sm: str | None, dtype: str, head_dim: int, backward: bool, driver: str | None
) -> Dispatch:
    return decide(wheel, Device("cuda", sm, None, driver), Call(dtype, head_dim, backward))


# A cu12-like wheel: SASS 7.5 (fp16 only), 8.0, 8.6, 9.0, 10.0, 12.0 and PTX 12.0.
CU12 = info(
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
    assert choice == Dispatch(path, arch, (), 128)


def test_sm70_has_no_kernel() -> None:
    choice = choose(CU12, "7.0", "fp16", 64, backward=False, driver="580.65.06")
    assert choice.path == "fallback"
    assert [r.code for r in choice.reasons] == ["arch-unsupported"]
    assert "7.0" in choice.reasons[0].message
    assert choice.reasons[0].fix


def test_sass_never_crosses_majors() -> None:
    only80 = info(cov("8.0"))
    assert choose(only80, "9.0", "bf16", 64, False, None).reasons[0].code == "arch-unsupported"
    assert choose(only80, "8.9", "bf16", 64, False, None).arch == "8.0"


def test_ptx_needs_a_new_enough_driver() -> None:
    old = choose(CU12, "13.0", "bf16", 128, backward=False, driver="550.54.15")
    assert old.path == "fallback"
    assert [r.code for r in old.reasons] == ["ptx-driver-too-old"]
    assert "575.51.03" in old.reasons[0].message
    assert "550.54.15" in old.reasons[0].message
    new = choose(CU12, "13.0", "bf16", 128, backward=False, driver="580.65.06")
    assert (new.path, new.arch) == ("ptx", "12.0")


def test_old_driver_does_not_matter_when_sass_fits() -> None:
    assert choose(CU12, "9.0", "bf16", 128, False, driver="525.60.13").path == "sass"


def test_ptx_newer_than_device_is_not_used() -> None:
    ptx_only = info(cov("9.0", image="ptx"), ptx="9.0", ptx_min_driver="550.54.15")
    assert choose(ptx_only, "8.6", "fp16", 64, False, None).reasons[0].code == "arch-unsupported"
    assert choose(ptx_only, "10.0", "fp16", 64, False, None).path == "ptx"


@pytest.mark.parametrize("dtype", ["bf16", "bfloat16", "torch.bfloat16"])
def test_bf16_on_turing(dtype: str) -> None:
    choice = choose(CU12, "7.5", dtype, 64, backward=False, driver=None)
    assert [r.code for r in choice.reasons] == ["dtype-unsupported"]
    # No wheel can hold bf16 kernels for sm 7.5 (Turing has no bf16 mma): the fix names none.
    assert (
        choice.reasons[0].fix
        == "use fp16: sm 7.5 has no bf16 tensor cores, so no wheel has bf16 kernels for it"
    )


def test_a_dtype_this_wheel_left_out_names_the_other_dtype_and_a_wheel_with_it() -> None:
    """A matrix may build one dtype (`kernels: {dtypes: [...]}`): on sm 8.0 the missing one exists in
    other wheels, and the fix says so without Turing's reason."""
    fp16_only = info(cov("8.0", dtypes=("fp16",)))
    (reason,) = choose(fp16_only, "8.0", "bf16", 64, False, None).reasons
    assert (reason.code, reason.fix) == (
        "dtype-unsupported",
        "use fp16, or a wheel with bf16 kernels for sm 8.0",
    )
    bf16_only = info(cov("8.0", dtypes=("bf16",)))
    (reason,) = choose(bf16_only, "8.0", "fp16", 64, False, None).reasons
    assert (reason.code, reason.fix) == (
        "dtype-unsupported",
        "use bf16, or a wheel with fp16 kernels for sm 8.0",
    )


def test_fp32_anywhere_is_unsupported() -> None:
    for sm in ("7.5", "8.0", "9.0"):
        assert choose(CU12, sm, "fp32", 64, False, None).reasons[0].code == "dtype-unsupported"


def test_head_dim_gaps() -> None:
    assert choose(CU12, "9.0", "fp16", 512, False, None).reasons[0].code == "head-dim-unsupported"
    small = info(cov("8.0", dims=[32, 64, 128]))
    assert choose(small, "8.0", "fp16", 96, False, None).reasons[0].code == "head-dim-unsupported"
    padded = choose(small, "8.0", "fp16", 60, False, None)  # 60 pads to 64, which is covered
    assert (padded.path, padded.head_dim) == ("sass", 64)


def test_backward_gap() -> None:
    fwd_only_256 = info(
        cov("8.6", dims=ALL_DIMS, directions=("fwd",)), cov("8.6", dims=range(8, 129, 8), directions=("bwd",))
    )
    assert choose(fwd_only_256, "8.6", "bf16", 256, backward=False, driver=None).path == "sass"
    choice = choose(fwd_only_256, "8.6", "bf16", 256, backward=True, driver=None)
    assert [r.code for r in choice.reasons] == ["backward-unsupported"]
    assert choose(fwd_only_256, "8.6", "bf16", 128, backward=True, driver=None).path == "sass"


def test_lower_minor_sass_fills_a_gap_of_the_best_one() -> None:
    mixed = info(cov("8.0"), cov("8.6", dims=[64]))
    assert choose(mixed, "8.6", "fp16", 128, False, None).arch == "8.0"


def test_no_gpu_and_universal() -> None:
    assert choose(CU12, None, "bf16", 128, False, None).reasons[0].code == "no-gpu"
    universal = info(cuda_major=None, binding=None)
    assert choose(universal, "9.0", "bf16", 128, False, None).reasons[0].code == "binding-unavailable"


def test_bad_values_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="dtype"):
        choose(CU12, "9.0", "int8", 128, False, None)
    with pytest.raises(ValueError, match="arch: 'hopper'"):
        choose(CU12, "hopper", "bf16", 128, False, None)
    with pytest.raises(ValueError, match="driver"):
        choose(CU12, "13.0", "bf16", 128, False, "latest")


@pytest.mark.parametrize("arch", ["sm_86", "86", "8", "8.6.1", ""])
def test_an_arch_is_written_major_dot_minor(arch: str) -> None:
    with pytest.raises(ValueError, match=r"write it like '8.6'"):
        versions.parse_arch(arch)
    assert versions.parse_arch("12.0") == (12, 0)


def _kernel(hd: int, direction: str = "fwd", smem: int = 49152) -> dict:
    return {
        "arch": "8.0",
        "image": "sass",
        "file": f"kernels/sm_80/{direction}_bf16_d{hd}.cubin",
        "unit": f"{direction}_bf16_d{hd}",
        "dtype": "bf16",
        "direction": direction,
        "head_dim": hd,
        "entries": {
            "fa_fwd": {"threads": 128, "block_m": 64, "block_n": 64, "smem_bytes": smem, "grid": "q_blocks"}
        },
    }


def test_the_launch_is_the_smallest_bucket_that_holds_the_head_dim() -> None:
    man = manifest(cov("8.0", dims=range(8, 129, 8)), kernels=[_kernel(hd) for hd in (128, 64, 32)])
    d = decide(man.info, Device("cuda", "8.0"), Call("bf16", 40), man.kernels, Path("/pkg"))
    assert d.fwd is not None
    assert d.fwd.module == "/pkg/kernels/sm_80/fwd_bf16_d64.cubin"
    assert d.fwd.launch == (64, 128, 64, 64, 49152, 0)
    assert d.bwd is None
    damaged = decide(man.info, Device("cuda", "8.0"), Call("bf16", 40, backward=True), man.kernels)
    assert [r.code for r in damaged.reasons] == ["binding-unavailable"]  # covered bwd, but no bwd file
    missing = manifest(cov("8.0", dims=range(8, 129, 8)), kernels=[_kernel(32)])
    d = decide(missing.info, Device("cuda", "8.0"), Call("bf16", 40), missing.kernels)
    assert [r.code for r in d.reasons] == ["binding-unavailable"]
    assert "no kernel file" in d.reasons[0].message


KV_FEATURES = ["causal", "gqa", "paged_kv", "seqused_k", "leftpad_k", "cache_batch_idx"]


def _split_kernel(hd: int, block_n: int) -> dict:
    kernel = _kernel(hd, "splitkv")
    kernel["entries"] = {
        "fa_fwd_splitkv": {"threads": 128, "block_m": 64, "block_n": block_n, "smem_bytes": 49152,
                           "grid": "q_blocks_splits"},
        "fa_fwd_combine": {"threads": 128, "block_m": 4, "block_n": 0, "smem_bytes": 0, "grid": "q_blocks"},
    }  # fmt: skip
    return kernel


KV_WHEEL = manifest(
    cov("8.0", directions=("fwd", "bwd", "splitkv"), dims=range(8, 65, 8)),
    kernels=[_kernel(64), _kernel(64, "bwd"), _split_kernel(64, 128)],
    features=KV_FEATURES,
)


def kv_call(page_size: int = 0, backward: bool = False, *features: str) -> Call:
    return Call("bf16", 64, backward, frozenset(features or ("paged_kv",)), page_size)


def test_pages_must_hold_whole_key_blocks() -> None:
    """The kernels read a key block from one page: pages of 128 suit the forward's 64-key blocks and
    split-KV's 128; pages of 64 only the forward's (no split-KV); pages of 32 neither (fallback)."""
    run = lambda call: decide(KV_WHEEL.info, Device("cuda", "8.0"), call, KV_WHEEL.kernels)
    both = run(kv_call(128))
    assert both.path == "sass"
    assert both.fwd is not None
    assert both.splitkv is not None
    fwd_only = run(kv_call(64))
    assert fwd_only.path == "sass"
    assert fwd_only.splitkv is None
    small = run(kv_call(32))
    assert [r.code for r in small.reasons] == ["feature-unsupported"]
    assert "pages of 32 keys" in small.reasons[0].message
    assert "multiple of 64" in small.reasons[0].fix
    assert run(kv_call(0, False, "seqused_k")).splitkv is not None  # not paged: no page rule


@pytest.mark.parametrize("feature", ["paged_kv", "seqused_k", "leftpad_k", "cache_batch_idx"])
def test_kv_layouts_have_no_backward(feature: str) -> None:
    d = decide(KV_WHEEL.info, Device("cuda", "8.0"), kv_call(128, True, feature), KV_WHEEL.kernels)
    assert [r.code for r in d.reasons] == ["backward-unsupported"]
    assert feature in d.reasons[0].message
    assert "torch.no_grad()" in d.reasons[0].fix


def test_a_wheel_without_the_kv_features_falls_back_for_them() -> None:
    """Wheels built before the layouts list no such feature: their kernels cannot read them."""
    old = manifest(cov("8.0", dims=range(8, 65, 8)), kernels=[_kernel(64)], features=["causal", "gqa"])
    d = decide(old.info, Device("cuda", "8.0"), kv_call(128), old.kernels)
    assert [r.code for r in d.reasons] == ["feature-unsupported"]
    assert "paged_kv" in d.reasons[0].message


def test_doctor_decides_without_kernel_files() -> None:
    assert choose(CU12, "8.0", "bf16", 40, False, None) == Dispatch("sass", "8.0", (), 40)


def test_an_image_needs_the_shared_memory_its_kernels_ask_for() -> None:
    """An sm_80 cubin runs on sm_86 only within sm_86's shared memory; the next image that fits wins."""
    rows = [
        {
            "arch": a,
            "image": "sass",
            "dtype": "bf16",
            "direction": "fwd",
            "head_dims": [256],
            "smem_bytes": need,
        }
        for a, need in (("8.0", 135168), ("8.6", 81920))
    ]
    only80 = info([rows[0]])
    d = decide(only80, Device("cuda", "8.6", 101376), Call("bf16", 256))
    assert [r.code for r in d.reasons] == ["arch-unsupported"]
    assert "135168" in d.reasons[0].message
    assert "101376" in d.reasons[0].message
    assert (
        decide(only80, Device("cuda", "8.6", None), Call("bf16", 256)).path == "sass"
    )  # unknown: not checked
    assert decide(only80, Device("cuda", "8.0", 167936), Call("bf16", 256)).path == "sass"
    both = info(rows)
    assert decide(both, Device("cuda", "8.6", 101376), Call("bf16", 256)).arch == "8.6"


def test_the_binding_loads_last_and_only_for_kernels() -> None:
    def never() -> None:
        raise AssertionError("the binding must load only for calls that use the kernels")

    assert decide(CU12, Device("cuda", "7.0"), Call("fp16", 64), load_binding=never).path == "fallback"
    failed = Reason("binding-unavailable", "loading libfa_attn_ops.so failed", "reinstall")
    d = decide(CU12, Device("cuda", "8.0"), Call("bf16", 64), load_binding=lambda: failed)
    assert d == Dispatch("fallback", None, (failed,))


def test_buildtool_loads_the_same_file() -> None:
    from buildtool.core.runtime import decision

    shared = decision.decide(CU12, decision.Device("cuda", "8.9"), decision.Call("fp16", 64))
    assert shared.arch == "8.6"
