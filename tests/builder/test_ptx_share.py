"""One NVRTC run per program: which targets share one (a pure function), the `.target` rewrite, and
with real NVRTC 11.8 and the real pinned ptxas, that a shared program's cubins and PTX are NVRTC's own
bytes; a ptxas wheel that does not match its pin is refused, and a missing or failing ptxas falls back
to NVRTC with a note."""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from buildtool.builder import ptxas, toolkits
from buildtool.builder.compile import CompileTask, KernelTree, compile_all, resolve
from buildtool.builder.nvrtc import open_nvrtc
from buildtool.builder.plan import CompileJob
from buildtool.core import cpus
from buildtool.core.cuda_facts import PinnedWheel


def _task(
    arch: str, source: str = "void k() {}", options: tuple[str, ...] = ("-DX=1",), major: int = 11
) -> CompileTask:
    number = arch.replace(".", "")
    return CompileTask(
        cuda_major=major,
        unit="u",
        target=f"sm_{number}",
        source_name="u.cu",
        source=source,
        headers=(("h.cuh", "#pragma once\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n#endif\n"),),
        options=options,
        nvrtc_version="11.8.89",
    )


def _jobs(**tasks: CompileTask) -> dict[CompileJob, CompileTask]:
    return {CompileJob(t.cuda_major, arch, "sass", t.unit + arch): t for arch, t in tasks.items()}


def test_one_program_for_several_targets_is_one_group_led_by_the_lowest():
    tasks = _jobs(**{"9.0": _task("9.0"), "8.0": _task("8.0"), "8.6": _task("8.6")})
    (leader, followers), *_ = ptxas.share_groups(tasks).items()
    assert tasks[leader].target == "sm_80"
    assert [tasks[f].target for f in followers] == ["sm_86", "sm_90"]
    assert len(ptxas.share_groups(tasks)) == 1


def test_targets_on_either_side_of_an_arch_branch_do_not_share():
    # h.cuh branches at 800: sm_75 preprocesses differently from sm_80 and sm_90
    tasks = _jobs(**{"7.5": _task("7.5"), "8.0": _task("8.0"), "9.0": _task("9.0")})
    groups = ptxas.share_groups(tasks)
    assert [(tasks[lead].target, [tasks[f].target for f in fs]) for lead, fs in groups.items()] == [
        ("sm_80", ["sm_90"])
    ]
    equal = "#if __CUDA_ARCH__ == 800\n#endif\n"  # == splits 800 from 900 though >= 800 does not
    assert not ptxas.share_groups(_jobs(**{"8.0": _task("8.0", equal), "9.0": _task("9.0", equal)}))
    flipped = "#if 900 <= __CUDA_ARCH__\n#endif\n"
    assert not ptxas.share_groups(_jobs(**{"8.0": _task("8.0", flipped), "9.0": _task("9.0", flipped)}))


def test_nothing_shares_when_the_program_is_not_provably_the_same():
    odd = "int v = __CUDA_ARCH__ / 100;"  # used as a value: no rule says two targets agree
    assert not ptxas.share_groups(_jobs(**{"8.0": _task("8.0", odd), "9.0": _task("9.0", odd)}))
    other = _jobs(**{"8.0": _task("8.0"), "9.0": _task("9.0", options=("-DX=2",))})
    assert not ptxas.share_groups(other)
    specific = {
        CompileJob(11, "8.0", "sass", "u"): _task("8.0"),
        CompileJob(11, "9.0a", "sass", "u"): replace(_task("9.0"), target="sm_90a"),
    }
    assert not ptxas.share_groups(specific)  # an arch-specific target has macros NVRTC alone defines
    cuda12 = _jobs(**{"10.0": _task("10.0", major=12), "12.0": _task("12.0", major=12)})
    assert not ptxas.share_groups(cuda12)  # not a SHARED_MAJOR: its cubins name their assembler
    assert len(ptxas.share_groups(cuda12, majors=ptxas.PINS)) == 1


def test_retarget_rewrites_the_one_target_line():
    ptx = b"//\n.version 7.8\n.target sm_80\n.address_size 64\n// .target sm_70 in a comment\n"
    assert ptxas.retarget(ptx, "sm_90") == ptx.replace(b".target sm_80\n", b".target sm_90\n")
    assert ptxas.retarget(b".target sm_80, debug\n", "sm_86") == b".target sm_86, debug\n"
    with pytest.raises(ptxas.PtxasError, match="found 0"):
        ptxas.retarget(b".version 7.8\n", "sm_90")


def test_pins_follow_nvrtc():
    for major, pin in ptxas.PINS.items():
        assert pin.version == toolkits.toolkit(major).version, major
        assert set(pin.wheels) == set(toolkits.toolkit(major).wheels), major
    assert ptxas.SHARED_MAJORS <= set(ptxas.PINS)


UNIT = "fwd_fp16_d32"
SASS80, SASS90, PTX90 = (
    CompileJob(11, a, i, UNIT) for a, i in (("8.0", "sass"), ("9.0", "sass"), ("9.0", "ptx"))
)


def _nvrtc_own(task: CompileTask) -> bytes:
    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(task.cuda_major)))
    return nvrtc.compile(
        task.source, task.source_name, task.target, list(task.options), dict(task.headers)
    ).image


@pytest.mark.slow
@pytest.mark.network  # the CUDA 11 NVRTC and nvcc wheels, once per machine
@pytest.mark.usefixtures("fresh_cache")
def test_a_shared_programs_images_are_nvrtcs_own_bytes():
    tree = KernelTree()
    notes: list[str] = []
    images, stats = compile_all([SASS80, SASS90, PTX90], workers=2, tree=tree, on_note=notes.append)
    assert notes == []
    assert set(stats.seconds) == {SASS80}  # one NVRTC run
    assert set(stats.ptxas) == {SASS90}  # sm_90 from its PTX by ptxas
    assert stats.with_cubin == {PTX90: SASS90}
    for job in (SASS80, SASS90, PTX90):
        assert images[job].read_bytes() == _nvrtc_own(resolve(job, tree)), job


FAKE_FILE = "fake_nvcc-1.0-py3-none-manylinux_2_17_x86_64.whl"


def _wheel(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.fixture
def fake_ptxas(tmp_path: Path, build_cache: Path, monkeypatch: pytest.MonkeyPatch):
    """Pin CUDA 11's ptxas to a wheel in a local FA_TOOLKIT_WHEELS folder: returns a function taking
    the wheel's bytes and the sha256 to pin. The cache is a fresh one holding the session's NVRTC 11."""
    root = tmp_path / "cache"
    (root / "toolkits").mkdir(parents=True)
    tk = toolkits.toolkit(11)
    nvrtc = build_cache / "toolkits" / f"{tk.package}-{tk.version}"
    toolkits.nvrtc_lib_dir(11)  # in the session's cache, before this test's takes over
    (root / "toolkits" / nvrtc.name).symlink_to(nvrtc)
    monkeypatch.setenv("FA_CACHE", str(root))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("FA_TOOLKIT_WHEELS", str(wheels))

    def pin(data: bytes, sha256: str | None = None) -> None:
        (wheels / FAKE_FILE).write_bytes(data)
        wheel = PinnedWheel(FAKE_FILE, sha256 or hashlib.sha256(data).hexdigest())
        monkeypatch.setitem(
            ptxas.PINS,
            11,
            replace(ptxas.PINS[11], package="fake-nvcc", version="1.0", wheels={cpus.host(): wheel}),
        )

    return pin


def _fixture_jobs() -> list[CompileJob]:
    return [CompileJob(11, arch, "sass", "fwd_fp16_d64") for arch in ("8.0", "9.0")]


def _falls_back(fixture_tree: Path, say: str) -> str:
    """compile_all of a program for two targets with the pinned ptxas unusable: both by NVRTC, one note."""
    tree = KernelTree(fixture_tree)
    notes: list[str] = []
    images, stats = compile_all(_fixture_jobs(), workers=1, tree=tree, on_note=notes.append)
    assert not stats.ptxas
    assert stats.compiled == 2
    assert len(notes) == 1, notes
    assert say in notes[0]
    for job, path in images.items():
        assert path.read_bytes() == _nvrtc_own(resolve(job, tree))
    return notes[0]


@pytest.mark.slow
@pytest.mark.network  # the CUDA 11 NVRTC wheel
def test_a_ptxas_wheel_not_matching_its_pin_is_refused(fake_ptxas, fixture_tree):
    data = _wheel({"nvidia/cuda_nvcc/bin/ptxas": b"#!/bin/sh\nexit 0\n"})
    fake_ptxas(data, hashlib.sha256(b"another file").hexdigest())
    with pytest.raises(
        toolkits.ToolkitError, match=r"ptxas for CUDA 11 \(fake-nvcc==1.0\).*does not match the pinned"
    ):
        ptxas.ptxas_path(11)
    assert not ptxas.is_unpacked(11)
    _falls_back(fixture_tree, "no ptxas for CUDA 11")


@pytest.mark.slow
@pytest.mark.network
def test_a_wheel_without_ptxas_falls_back_to_nvrtc(fake_ptxas, fixture_tree):
    fake_ptxas(_wheel({"nvidia/cuda_nvcc/bin/nvcc": b"not ptxas"}))
    _falls_back(fixture_tree, "holds nothing named nvidia/cuda_nvcc/bin/ptxas")


@pytest.mark.slow
@pytest.mark.network
def test_a_failing_ptxas_falls_back_to_nvrtc_for_that_target(fake_ptxas, fixture_tree):
    script = b"#!/bin/sh\necho 'ptxas fatal : out of luck' >&2\nexit 3\n"
    fake_ptxas(_wheel({"nvidia/cuda_nvcc/bin/ptxas": script}))
    note = _falls_back(fixture_tree, "fwd_fp16_d64 for sm_90 (CUDA 11)")
    assert "exited 3: ptxas fatal : out of luck" in note
    assert note.endswith("compiled by NVRTC instead")
