"""Runtime dispatch: decide() over described calls, the loader's checks, warn-once, FA_STRICT, explain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import fa_attn
import pytest
import torch
from fa_attn import versions
from fa_attn.runtime import dispatch, loader
from fa_attn.runtime.decision import Call, Device
from fa_attn.runtime.dispatch import CallFacts, decide
from fa_attn.schema import Manifest

DIMS = list(range(8, 257, 8))


def kernels_for(arch: str, dtype: str, direction: str) -> list[dict]:
    entries = {
        "fa_fwd": {"threads": 128, "block_m": 128, "block_n": 64, "smem_bytes": 49152, "grid": "q_blocks"}
    }
    if direction == "bwd":
        entries = {
            name: {"threads": 256, "block_m": 64, "block_n": 64, "smem_bytes": 90000, "grid": grid}
            for name, grid in (
                ("fa_bwd_preprocess", "q_blocks"),
                ("fa_bwd", "k_blocks"),
                ("fa_bwd_convert_dq", "q_blocks"),
            )
        }
    return [
        {
            "arch": arch,
            "image": "sass",
            "file": f"kernels/sm_{arch.replace('.', '')}/{direction}_{dtype}_d{hd}.cubin",
            "unit": f"{direction}_{dtype}_d{hd}",
            "direction": direction,
            "dtype": dtype,
            "head_dim": hd,
            "entries": entries,
        }
        for hd in (64, 128, 256)
    ]


MANIFEST_JSON = {
    "schema": 1,
    "version": "0.1.0+cu12torch2.13",
    "cuda_major": 12,
    "torch": "2.13",
    "cxx11abi": True,
    "binding": "libfa_attn_ops.so",
    "ptx": None,
    "ptx_min_driver": None,
    "features": ["causal", "gqa", "varlen", "window", "softcap"],
    "kernels": [k for d in ("fp16", "bf16") for r in ("fwd", "bwd") for k in kernels_for("8.0", d, r)],
}
BELOW = {64: 0, 128: 64, 256: 128}  # bucket -> the bucket below it: it serves the head dims between
# What the build derives from those kernels (package.coverage_of): each bucket's head dims, its smem.
MANIFEST_JSON["coverage"] = [
    {
        "arch": k["arch"],
        "image": k["image"],
        "dtype": k["dtype"],
        "direction": k["direction"],
        "head_dims": [d for d in DIMS if BELOW[k["head_dim"]] < d <= k["head_dim"]],
        "smem_bytes": max(e["smem_bytes"] for e in k["entries"].values()),
    }
    for k in MANIFEST_JSON["kernels"]
]


def manifest(**changes) -> Manifest:
    return Manifest.from_json({**MANIFEST_JSON, **changes})


MANIFEST = manifest()


def facts(sm="8.6", dtype="bf16", head_dim=100, backward=True, features=(), device="cuda", smem=None):
    return CallFacts(Device(device, sm, smem), Call(dtype, head_dim, backward, frozenset(features)))


def loaded() -> None:
    return None


def test_kernels_chosen_with_bucket_and_padding() -> None:
    d = decide(facts(features=("causal", "gqa")), MANIFEST, loaded)
    assert (d.path, d.arch, d.head_dim, d.reasons) == ("sass", "8.0", 104, ())
    assert d.fwd.launch == (128, 128, 128, 64, 49152, 0)  # bucket, then threads, block_m/n, smem, q_blocks
    assert d.fwd.module.endswith("kernels/sm_80/fwd_bf16_d128.cubin")
    assert d.bwd.entries == "fa_bwd_preprocess,fa_bwd,fa_bwd_convert_dq"
    assert d.bwd.launch == (128, 256, 64, 64, 90000, 0, 256, 64, 64, 90000, 1, 256, 64, 64, 90000, 0)
    assert decide(facts(backward=False), MANIFEST, loaded).bwd is None


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"device": "cpu"}, "device-not-cuda"),
        ({"device": "mps"}, "device-not-cuda"),
        ({"device": "rocm"}, "device-not-cuda"),
        ({"sm": "7.0"}, "arch-unsupported"),
        ({"sm": "9.0"}, "arch-unsupported"),  # only sm_80 SASS in this manifest, no PTX
        ({"dtype": "fp32"}, "dtype-unsupported"),
        ({"dtype": "fp64"}, "dtype-unsupported"),
        ({"head_dim": 512}, "head-dim-unsupported"),
        ({"features": ("dropout",)}, "feature-unsupported"),
        ({"features": ("alibi",)}, "feature-unsupported"),
        ({"features": ("deterministic",)}, "feature-unsupported"),
    ],
)
def test_fallback_reasons(kwargs: dict, code: str) -> None:
    d = decide(facts(**kwargs), MANIFEST, loaded)
    assert d.path == "fallback"
    assert d.reasons[0].code == code
    assert all(r.message and r.fix for r in d.reasons)


def test_kernels_that_need_more_shared_memory_than_the_gpu_offers_fall_back() -> None:
    # The manifest's only SASS is 8.0 (bwd tiles of 90000 bytes); an 8.6 part offers 101376 and an
    # imaginary 8.x part with 64 KB would fail at launch, so it falls back with the numbers named.
    assert decide(facts(smem=101376), MANIFEST, loaded).path == "sass"
    d = decide(facts(smem=65536), MANIFEST, loaded)
    assert d.path == "fallback"
    assert d.reasons[0].code == "arch-unsupported"
    assert "90000" in d.reasons[0].message
    assert "65536" in d.reasons[0].message
    assert decide(facts(smem=65536, backward=False), MANIFEST, loaded).path == "sass"  # fwd needs 49152


def test_feature_reason_names_the_feature() -> None:
    d = decide(facts(features=("dropout", "causal")), MANIFEST, loaded)
    assert [r.code for r in d.reasons] == ["feature-unsupported"]
    assert d.reasons[0].message.startswith("dropout is not supported")


def test_manifest_without_features_supports_only_plain_calls() -> None:
    bare = Manifest.from_json({k: v for k, v in MANIFEST_JSON.items() if k != "features"})
    assert decide(facts(features=()), bare, loaded).path == "sass"
    assert decide(facts(features=("causal",)), bare, loaded).reasons[0].code == "feature-unsupported"


def test_binding_failure_is_a_reason() -> None:
    why = fa_attn.Reason(
        "binding-unavailable", "loading libfa_attn_ops.so failed: undefined symbol", "reinstall"
    )
    d = decide(facts(), MANIFEST, lambda: why)
    assert d.path == "fallback"
    assert d.reasons == (why,)


def test_binding_is_not_loaded_when_the_call_falls_back_anyway() -> None:
    def never() -> None:
        raise AssertionError("the binding must load lazily, only for calls that use the kernels")

    assert decide(facts(sm="7.0"), MANIFEST, never).path == "fallback"


def test_ptx_driver_read_only_when_ptx_exists() -> None:
    with_ptx = manifest(
        ptx="8.0",
        ptx_min_driver="575.51.03",
        coverage=MANIFEST_JSON["coverage"] + [dict(c, image="ptx") for c in MANIFEST_JSON["coverage"]],
    )
    d = decide(facts(sm="9.0"), with_ptx, loaded, driver=lambda: "550.54.15")
    assert d.reasons[0].code == "ptx-driver-too-old"


@pytest.mark.parametrize(
    ("man", "code"),
    [
        (loader.UNIVERSAL_MANIFEST, "binding-unavailable"),
        (manifest(torch="2.5"), "torch-version-mismatch"),
        (
            manifest(
                torch=versions.torch_minor(torch.__version__),
                cxx11abi=not torch._C._GLIBCXX_USE_CXX11_ABI,
            ),
            "cxx11abi-mismatch",
        ),
    ],
)
def test_loader_checks_before_loading(man: Manifest, code: str) -> None:
    problem = loader.static_binding_problem(man)
    assert problem is not None
    assert problem.code == code


def test_loader_turns_a_broken_binding_into_a_reason(tmp_path, monkeypatch) -> None:
    (tmp_path / "libfa_attn_ops.so").write_bytes(b"not an ELF file")
    monkeypatch.setattr(loader, "PACKAGE_DIR", tmp_path)
    man = manifest(torch=versions.torch_minor(torch.__version__), cxx11abi=torch._C._GLIBCXX_USE_CXX11_ABI)
    problem = loader._load(man)
    assert problem is not None
    assert problem.code == "binding-unavailable"
    assert "libfa_attn_ops.so" in problem.message


def test_manifest_next_to_the_package(tmp_path) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(MANIFEST_JSON))
    assert loader.read_manifest(path) == (MANIFEST, None)
    for damaged in (
        "{broken",
        json.dumps(dict(MANIFEST_JSON, schema=2)),
        json.dumps(dict(MANIFEST_JSON, sass="8.0")),
    ):
        path.write_text(damaged)
        man, problem = loader.read_manifest(path)
        assert man == loader.UNIVERSAL_MANIFEST
        assert problem is not None
        assert loader.static_binding_problem(man, problem).code == "binding-unavailable"
    # A source checkout has no manifest: it behaves as the universal wheel.
    assert loader.read_manifest(tmp_path / "absent.json") == (loader.UNIVERSAL_MANIFEST, None)


@pytest.fixture
def fresh_reports(monkeypatch):
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.delenv("FA_STRICT", raising=False)


def small():
    return torch.randn(1, 3, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)


@pytest.mark.usefixtures("fresh_reports")
def test_warns_once_per_reason_code() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            fa_attn.flash_attn_func(*small())
    fallbacks = [w for w in caught if issubclass(w.category, fa_attn.FaFallbackWarning)]
    assert len(fallbacks) == 1
    assert "[device-not-cuda]" in str(fallbacks[0].message)
    assert fallbacks[0].filename == __file__  # points at the caller's line


@pytest.mark.usefixtures("fresh_reports")
def test_strict_mode_raises_with_code(monkeypatch) -> None:
    monkeypatch.setenv("FA_STRICT", "1")
    with pytest.raises(fa_attn.FaFallbackError, match="device-not-cuda"):
        fa_attn.flash_attn_func(*small())


@pytest.mark.usefixtures("fresh_reports")
def test_last_dispatch_and_explain() -> None:
    q, k, v = small()
    d = fa_attn.explain(q, k, v, causal=True)
    assert d.path == "fallback"
    assert d.reasons[0].code == "device-not-cuda"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fa_attn.flash_attn_func(q, k, v)
    assert fa_attn.last_dispatch() == d
    cu = torch.tensor([0, 3], dtype=torch.int32)
    cu_k = torch.tensor([0, 4], dtype=torch.int32)
    assert fa_attn.explain(q[0], k[0], v[0], cu, cu_k, 3, 4).path == "fallback"
    with pytest.raises(ValueError, match="unknown option"):
        fa_attn.explain(q, k, v, casual=True)


def test_features_of_a_call() -> None:
    from fa_attn.runtime import inputs

    q, k, v = torch.randn(1, 3, 4, 8), torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8)
    call = inputs.check_padded(q, k, v, 0.1, None, True, (2, -1), 0.0, None, True)
    assert dispatch.features_of(call, backward=True) == {
        "causal",
        "gqa",
        "window",
        "dropout",
        "deterministic",
    }
    assert "deterministic" not in dispatch.features_of(call, backward=False)
    # flash-attn's normalisation: window (-1, 0) is causal; a window >= seqlen_k is no window
    call = inputs.check_padded(q, q, q, 0.0, None, False, (-1, 0), 0.0, None, False)
    assert dispatch.features_of(call, backward=False) == {"causal"}
    call = inputs.check_padded(q, q, q, 0.0, None, False, (3, 3), 0.0, None, False)
    assert dispatch.features_of(call, backward=False) == frozenset()


def test_import_refuses_a_torch_older_than_the_ops_need() -> None:
    code = "import torch; torch.__version__ = '1.13.1+cu117'; import fa_attn"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(fa_attn.__file__).parents[1])},
    )
    assert done.returncode != 0
    assert "ImportError: fa_attn needs torch >= 2.4" in done.stderr
    assert "1.13.1+cu117" in done.stderr
