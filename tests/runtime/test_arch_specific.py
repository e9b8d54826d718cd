"""The arch-specific sm_90a units (issue 39) in the decision and the runtime's admission, on manifests
that `fa build`'s packager writes from kernels/tiles.py's table (the sm_90a units listed whether or not
csrc/hopper_fwd.cu is in this tree: nothing here compiles or runs a kernel).

On compute capability 9.0 exactly the sm_90a forward comes first, but only once its check passed for
the call's class (a `fa check` record here: no GPU runs a first-use check on this machine); a failed or
impossible check, or a call it does not serve, passes the call to the sm 9.0 units with the reason in
`passed_over`. Every other GPU never gets it. Not verified on a GPU.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import tiles
import torch
from fa_attn.runtime.decision import Call, Device, Dispatch, decide
from fa_attn.runtime.inputs import Options, make_call
from fa_attn.schema import Manifest
from fa_attn.verify import record as records
from fa_attn.verify import selfcheck

from buildtool.builder import package
from buildtool.builder.plan import CompileJob
from tests.select.fixture_index import kernel_spec, table_tiles

# kernels/tiles.py with every table unit, the sm_90a ones included before their source lands.
TABLE = table_tiles()
SASS = ("8.0", "8.6", "9.0", "9.0a", "10.0", "12.0")
H100 = Device("cuda", "9.0", 227 * 1024, "580.65.06")


def built(
    sass: tuple[str, ...] = SASS, ptx: str | None = "12.0", directions: tuple[str, ...] = tiles.DIRECTIONS
) -> Manifest:
    """The manifest of a cu12 wheel with SASS for `sass` and PTX of `ptx` (units of `directions`: a
    matrix's kernel filter), read back from its JSON."""
    images = [(arch, "sass") for arch in sass] + ([(ptx, "ptx")] if ptx else [])
    units = {a: [u for u in tiles.table_units(a) if u.direction in directions] for a, _ in images}
    jobs = tuple(CompileJob(12, a, image, u.name) for a, image in images for u in units[a])
    spec = dataclasses.replace(kernel_spec(12, "2.8", True), sass=sass, ptx=ptx, compile_jobs=jobs)
    text = json.dumps(package.manifest(spec, TABLE).to_json())
    return Manifest.from_json(json.loads(text))


MANIFEST = built()


def route(device: Device, call: Call, man: Manifest = MANIFEST) -> Dispatch:
    return decide(man.info, device, call, man.kernels, Path("/wheel/fa_attn"))


def modules(dispatch: Dispatch) -> list[str]:
    launches = (dispatch.fwd, dispatch.bwd, dispatch.splitkv)
    return [launch.module for launch in launches if launch is not None]


def test_the_manifest_marks_the_sm90a_units_arch_specific() -> None:
    specific = [k for k in MANIFEST.kernels if k.arch_specific]
    assert {(k.dtype, k.head_dim) for k in specific} == {
        (dtype, d) for dtype in ("fp16", "bf16") for d in (64, 96, 128, 192, 256)
    }
    for kernel in specific:
        assert (kernel.arch, kernel.target, kernel.image, kernel.direction) == ("9.0", "9.0a", "sass", "fwd")
        assert kernel.file == f"kernels/sm_90a/{kernel.unit}.cubin"
        assert list(kernel.entries) == ["fa_fwd_sm90a"]
        launch = kernel.entries["fa_fwd_sm90a"]
        assert launch.threads == 128 * (1 + launch.block_m // 64)
    assert not any(k.arch_specific for k in MANIFEST.kernels if k.file.startswith("kernels/sm_90/"))
    info = MANIFEST.info
    # `sass` keeps plain archs, so a reader before schema 1.4 never takes sm_90a's SASS for 9.x's.
    assert info.sass == ("8.0", "8.6", "9.0", "10.0", "12.0")
    assert info.arch_specific == ("9.0a",)
    assert set(info.arch_specific_features) <= set(info.features)
    assert {r.target for r in info.coverage if r.arch_specific} == {"9.0a"}
    # The d192 unit serves 136 to 192: the sm_90a buckets are FlashAttention-3's, no 160 between.
    d192 = next(r for r in info.coverage if r.arch_specific and r.dtype == "bf16" and 192 in r.head_dims)
    assert d192.head_dims[0] == 136


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [40, 64, 96, 128, 144, 192, 256])
def test_9_0_chooses_the_sm90a_unit_with_the_sm90_route_behind_it(dtype: str, head_dim: int) -> None:
    chosen = route(H100, Call(dtype, head_dim))
    assert (chosen.path, chosen.arch, chosen.passed_over) == ("sass", "9.0a", ())
    assert chosen.fwd is not None
    assert "/kernels/sm_90a/fwd_" in chosen.fwd.module
    assert chosen.then is not None
    assert (chosen.then.path, chosen.then.arch) == ("sass", "9.0")
    assert not any("sm_90a" in m for m in modules(chosen.then))
    # No split-KV form of its own: the sm 9.0 split-KV unit serves a decode call's split.
    assert chosen.splitkv is not None
    assert "/kernels/sm_90/splitkv_" in chosen.splitkv.module
    assert chosen.splitkv == chosen.then.splitkv


@pytest.mark.parametrize(
    "sm", ["7.5", "8.0", "8.6", "8.7", "8.9", "9.1", "10.0", "10.3", "11.0", "12.0", "12.1", "13.0"]
)
@pytest.mark.parametrize("backward", [False, True])
def test_every_other_arch_never_chooses_sm90a(sm: str, backward: bool) -> None:
    for dtype in ("fp16", "bf16"):
        for head_dim in (64, 128, 256):
            chosen = route(Device("cuda", sm, None, "580.65.06"), Call(dtype, head_dim, backward))
            assert chosen.arch != "9.0a", (sm, chosen)
            assert chosen.then is None
            assert chosen.passed_over == ()
            assert not any("sm_90a" in m for m in modules(chosen))


def test_a_9_0_gpu_without_sm90_sass_jits_ptx_never_sm90a() -> None:
    """9.0 with a wheel whose SASS is 8.0 and 9.0a only: a call the sm_90a unit does not serve (the
    backward) JITs the 8.0 PTX, not sm_90a, and says why."""
    man = built(sass=("8.0", "9.0a"), ptx="8.0")
    chosen = route(H100, Call("bf16", 128, backward=True), man)
    assert (chosen.path, chosen.arch) == ("ptx", "8.0")
    assert [r.code for r in chosen.passed_over] == ["arch-specific-unsupported"]


def test_there_is_never_ptx_of_sm90a() -> None:
    with pytest.raises(ValueError, match=r"arch-specific: its PTX JITs on compute capability 9\.0 only"):
        package.kernel_file(CompileJob(12, "9.0a", "ptx", "fwd_bf16_d128"))
    assert package.kernel_file(CompileJob(12, "9.0a", "sass", "fwd_bf16_d128")) == (
        "kernels/sm_90a/fwd_bf16_d128.cubin"
    )


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (Call("bf16", 128, backward=True), "backward-unsupported"),  # forward only
        # pages of 256 keys split sm_90a's d256 key blocks of 80; sm 9.0's d256 unit reads 64-key blocks
        (
            Call("bf16", 256, features=frozenset({"paged_kv"}), page_size=256),
            "feature-unsupported: paged_kv with pages of 256 keys",
        ),
    ],
)
def test_a_call_sm90a_does_not_serve_goes_to_sm90_with_its_reason(call: Call, why: str) -> None:
    chosen = route(H100, call)
    assert (chosen.path, chosen.arch) == ("sass", "9.0")
    (reason,) = chosen.passed_over
    assert reason.code == "arch-specific-unsupported"
    assert f"sm 9.0a units do not serve this call ({why}" in reason.message


@pytest.mark.parametrize(
    "features",
    [{"causal", "gqa"}, {"varlen", "window"}, {"softcap"}, {"seqused_k", "leftpad_k", "cache_batch_idx"}],
)
def test_what_hopper_fwd_implements_runs_on_sm90a(features: set[str]) -> None:
    """hkernel's list (hopper_api.md): every forward feature, paged KV too (below)."""
    assert route(H100, Call("bf16", 128, features=frozenset(features))).arch == "9.0a"


@pytest.mark.parametrize(
    ("dtype", "head_dim", "page_size", "then"),
    [("bf16", 128, 256, "9.0"), ("fp16", 64, 128, "9.0"), ("fp16", 192, 96, None)],
)
def test_paged_kv_runs_on_sm90a_where_pages_hold_its_key_blocks(
    dtype: str, head_dim: int, page_size: int, then: str | None
) -> None:
    """A decode over a paged cache on an H100: the sm_90a forward TMA-loads each key block from its page
    when pages hold whole key blocks of its tile (128 keys at d64 and d128, 96 at d192). Pages of 96 split
    sm 9.0's 64-key blocks: behind sm_90a (until its check passes, or where it fails) such a call falls
    back to SDPA, saying so."""
    call = Call(dtype, head_dim, features=frozenset({"paged_kv", "seqused_k"}), page_size=page_size)
    chosen = route(H100, call)
    assert (chosen.path, chosen.arch, chosen.passed_over) == ("sass", "9.0a", ())
    assert chosen.fwd is not None
    assert "/kernels/sm_90a/fwd_" in chosen.fwd.module
    assert chosen.then is not None
    assert chosen.then.arch == then
    if then is None:
        assert [r.code for r in chosen.then.reasons] == ["feature-unsupported"]
        assert "pages of 96 keys" in chosen.then.reasons[0].message


def test_a_9_0_part_with_less_shared_memory_passes_the_large_tile_on() -> None:
    """The sm_90a d256 tile asks 229,456 B; a 9.0 part offering less runs sm 9.0's (FA2-class) d256."""
    small = dataclasses.replace(H100, smem_per_block=200 * 1024)
    chosen = route(small, Call("fp16", 256))
    assert (chosen.path, chosen.arch) == ("sass", "9.0")
    assert "shared memory" in chosen.passed_over[0].message
    assert route(small, Call("fp16", 128)).arch == "9.0a"


def test_doctor_reads_the_same_choice_without_kernel_files() -> None:
    chosen = decide(MANIFEST.info, H100, Call("bf16", 128))
    assert (chosen.path, chosen.arch, chosen.fwd) == ("sass", "9.0a", None)
    assert chosen.then is not None
    assert chosen.then.arch == "9.0"


# ---- the runtime's admission: only after its check passed for the call's class ---------------------

KEY = records.RecordKey("wheel", "NVIDIA H100 80GB HBM3", "9.0", "580.65.06", torch.__version__)
CUDA = torch.device("cuda", 0)  # a name only: records decide, no kernel runs (no GPU here)


def h100_call(causal: bool = True):
    q = k = v = torch.empty(1, 96, 4, 128, dtype=torch.bfloat16)
    return make_call(q, k, v, 1, 96, 96, Options(128**-0.5, 0.0, 0.0, None), causal, (-1, -1), False)


@pytest.fixture
def h100(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The runtime's admission on an H100's identity with records in tmp_path (the device identity is
    the stand-in: no GPU here), nothing captured; `record(**verdicts)` writes `fa check`'s record."""
    monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path))
    monkeypatch.setenv("FA_SELF_CHECK", "first-use")
    monkeypatch.setattr(selfcheck, "key_of", lambda _device: KEY)
    monkeypatch.setattr(selfcheck, "in_capture", lambda _device: False)
    selfcheck.reset()

    def record(**verdicts: records.UnitResult) -> None:
        units = {name.replace("__", "/"): result for name, result in verdicts.items()}
        records.write(records.Record(KEY, "2026-11-28T14:00:00Z", "fa check", units))
        selfcheck.reset()

    yield record
    selfcheck.reset()


PASS = records.UnitResult("pass", max_err=1e-3, bound=4e-3)
FAIL = records.UnitResult("fail", "out: error 0.5 > bound 0.004 (fwd causal bf16 d128)", 0.5, 4e-3)


def admitted(**kwargs) -> Dispatch:
    call = h100_call()
    return selfcheck.admit(route(H100, Call("bf16", 128, features=frozenset({"causal"}))), call, CUDA,
                           torch.bfloat16, False, **kwargs)  # fmt: skip


def test_9_0_runs_sm90a_once_its_check_passed(h100) -> None:
    h100(sm_90a__fwd_bf16_d128=PASS, sm_90__fwd_bf16_d128=PASS)
    chosen = admitted()
    assert (chosen.path, chosen.arch, chosen.verified, chosen.passed_over) == ("sass", "9.0a", "record", ())


def test_9_0_with_a_failed_check_chooses_sm90(h100) -> None:
    h100(sm_90a__fwd_bf16_d128=FAIL, sm_90__fwd_bf16_d128=PASS)
    with pytest.warns(
        selfcheck.FaSelfCheckWarning, match=r"sm_90a/fwd_bf16_d128 .* run on the sm 9\.0 units"
    ):
        chosen = admitted()
    assert (chosen.path, chosen.arch, chosen.verified) == ("sass", "9.0", "record")
    (reason,) = chosen.passed_over
    assert reason.code == "arch-specific-check-failed"
    assert "unit sm_90a/fwd_bf16_d128 failed" in reason.message
    assert reason.message.endswith("the sm 9.0 units run the call")
    # A decode loop's next call: the same answer object, no new Dispatch per call.
    decided, call = route(H100, Call("bf16", 128, features=frozenset({"causal"}))), h100_call()
    first = selfcheck.admit(decided, call, CUDA, torch.bfloat16, False)
    assert selfcheck.admit(decided, call, CUDA, torch.bfloat16, False) is first


@pytest.mark.filterwarnings("ignore::fa_attn.selfcheck.FaSelfCheckWarning")
def test_both_failed_falls_back_with_both_reasons(h100) -> None:
    h100(sm_90a__fwd_bf16_d128=FAIL, sm_90__fwd_bf16_d128=FAIL)
    chosen = admitted()
    assert chosen.path == "fallback"
    assert [r.code for r in chosen.reasons] == ["self-check-failed"]
    assert [r.code for r in chosen.passed_over] == ["arch-specific-check-failed"]


@pytest.mark.usefixtures("h100")
def test_sm90a_never_runs_unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside graph capture no check can run: the sm 9.0 unit may run unchecked (as everywhere), the
    sm_90a one never does."""
    monkeypatch.setattr(selfcheck, "in_capture", lambda _device: True)
    chosen = admitted()
    assert (chosen.path, chosen.arch, chosen.verified) == ("sass", "9.0", "unchecked")
    assert [r.code for r in chosen.passed_over] == ["arch-specific-unchecked"]


def test_self_check_off_never_runs_sm90a(h100, monkeypatch: pytest.MonkeyPatch) -> None:
    h100(sm_90a__fwd_bf16_d128=PASS)
    monkeypatch.setenv("FA_SELF_CHECK", "off")
    chosen = admitted()
    assert (chosen.path, chosen.arch, chosen.verified) == ("sass", "9.0", "off")
    assert [r.code for r in chosen.passed_over] == ["arch-specific-unchecked"]


@pytest.mark.filterwarnings("ignore::fa_attn.selfcheck.FaSelfCheckWarning")
def test_torch_compile_tracing_answers_from_records_alike(h100) -> None:
    h100(sm_90a__fwd_bf16_d128=FAIL, sm_90__fwd_bf16_d128=PASS)
    decided = route(H100, Call("bf16", 128, features=frozenset({"causal"})))
    cls = tuple(selfcheck.class_of(h100_call()))
    chosen = selfcheck.traced(decided, CUDA, torch.bfloat16, cls, False, False, "first-use")
    assert (chosen.arch, chosen.verified) == ("9.0", "record")
    assert [r.code for r in chosen.passed_over] == ["arch-specific-check-failed"]
    h100(sm_90a__fwd_bf16_d128=PASS)
    chosen = selfcheck.traced(decided, CUDA, torch.bfloat16, cls, False, False, "first-use")
    assert (chosen.arch, chosen.verified) == ("9.0a", "record")


def test_fa_check_on_an_h100_checks_sm90a_and_the_sm90_units_behind_it() -> None:
    """`fa check` (fa_attn.check.jobs_on, the runtime's decision per kernel file): on 9.0 both the sm_90a
    forward and sm 9.0's forward, which serves until sm_90a passed and wherever it fails, in a wheel of
    forward units only too (where no backward call reaches sm 9.0's forward); elsewhere no sm_90a unit."""
    from fa_attn.verify import check

    forward_only = built(directions=("fwd", "splitkv"))
    for man in (MANIFEST, forward_only):
        jobs, _ = check.jobs_on(H100, 0, man, driver=lambda: "580.65.06", package_dir=Path("/wheel/fa_attn"))
        units = {job.unit for job in jobs}
        for dtype in ("fp16", "bf16"):
            assert {f"sm_90a/fwd_{dtype}_d{d}" for d in (64, 96, 128, 192, 256)} <= units
            assert {f"sm_90/fwd_{dtype}_d{d}" for d in tiles.HEAD_DIM_BUCKETS} <= units
        # the sm_90a units read paged KV (the manifest lists it): their check runs the paged problems too
        assert {job.paged for job in jobs if job.unit.startswith("sm_90a/")} == {True}
        assert {job.paged for job in jobs if job.unit.startswith("sm_90/")} == {True}
    a100 = Device("cuda", "8.0", 163 * 1024, "580.65.06")
    jobs, _ = check.jobs_on(a100, 0, MANIFEST, driver=lambda: "580.65.06", package_dir=Path("/wheel/fa_attn"))
    assert jobs
    assert not any("sm_90a" in job.unit for job in jobs)


def test_fa_check_runs_the_lowest_head_dims_each_unit_serves() -> None:
    """Each unit's head-dim problems start at the smallest head dim it serves, read from the wheel's
    coverage: the sm_90a d192 forward serves 136 to 192 (FlashAttention-3's buckets), so it is checked at
    136 and 144, not at 168 and 176 (what the plain buckets' restatement gave it); sm 9.0's d256 unit
    serves 200 to 256, so 200 and 208."""
    from fa_attn.verify import check

    jobs, _ = check.jobs_on(H100, 0, MANIFEST, driver=lambda: "580.65.06", package_dir=Path("/wheel/fa_attn"))
    by_unit = {job.unit: job for job in jobs}
    expected = {
        "sm_90a/fwd_bf16_d192": (136, 144),
        "sm_90/bwd_fp16_d256": (200, 208),
        "sm_90/fwd_fp16_d64": (40, 48),
    }
    for unit, dims in expected.items():
        job = by_unit[unit]
        names = [p.name for p in check.problems(
            torch.bfloat16, job.launch[0], job.direction, medium=False, lowest_head_dim=job.lowest_head_dim
        )]  # fmt: skip
        assert [n for n in names if n.startswith("hdim")] == [f"hdim{d}" for d in dims], unit
        served = [d for d in range(8, job.launch[0] + 1, 8) if tiles.bucket_of(d) == job.launch[0]]
        assert unit.startswith("sm_90a") or job.lowest_head_dim == served[0], unit
