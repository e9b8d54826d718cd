"""A build with nothing changed assembles no wheel and writes no index file (issue 37: a no-op rebuild
of the release cost 11 s of CPU, re-reading every image and re-encoding the index), while anything
changed since, by fa or by hand, is still rebuilt or refused as before. Stamps live in the cache
(core/cache.py); bench/build/noop_build.py measures the whole command."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from buildtool.builder import index, package
from buildtool.builder.compile import KernelTree
from buildtool.builder.out_files import OutFileError
from buildtool.builder.plan import CompileJob
from buildtool.core import cache
from buildtool.core.fetch import sha256_file
from tests.builder.conftest import fa_command
from tests.builder.test_build_cli import TINY
from tests.builder.test_reproducible import JOBS, SPEC  # a one-wheel spec of the fixture tree
from tests.child import run_child


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[dict[CompileJob, Path], Path]:
    images = {}
    for i, job in enumerate(JOBS):
        images[job] = tmp_path / f"img{i}"
        images[job].write_bytes(f"image of {job}".encode())
    (tmp_path / "x.c").write_text("int fa_answer(void) { return 42; }\n")
    lib = tmp_path / "libx.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "x.c"), "-o", str(lib)], check=True)
    return images, lib


@pytest.fixture
def build(
    fresh_cache: Path,  # noqa: ARG001 (the stamps go into a cache of the test's own)
    fixture_tree: Path,
    inputs: tuple[dict[CompileJob, Path], Path],
    tmp_path: Path,
) -> Callable[[], package.BuiltWheel]:
    """build_wheel of SPEC from `inputs` into tmp_path/wheels, as each build of a plan calls it."""
    images, lib = inputs
    tiles = KernelTree(fixture_tree).tiles
    return lambda: package.build_wheel(SPEC, tmp_path / "wheels", fixture_tree, tiles, images, lib)


def test_an_unchanged_wheel_is_found_not_assembled_and_a_changed_input_rebuilds_it(
    build: Callable[[], package.BuiltWheel], inputs: tuple[dict[CompileJob, Path], Path]
) -> None:
    first = build()
    assert first.manifest is not None  # assembled
    state = cache.file_state(first.path)
    again = build()
    assert again.manifest is None  # found as fa wrote it: nothing read, nothing written
    assert (again.path, again.platform, again.platform_reason) == (
        first.path,
        first.platform,
        first.platform_reason,
    )
    assert cache.file_state(again.path) == state

    inputs[0][JOBS[0]].write_bytes(b"another image")  # an input changed: packed again, with it
    changed = build()
    assert changed.manifest is not None
    with zipfile.ZipFile(changed.path) as zf:
        assert zf.read("fa_attn/kernels/sm_80/fwd_fp16_d64.cubin") == b"another image"


def test_a_wheel_changed_by_hand_is_not_reused(build: Callable[[], package.BuiltWheel]) -> None:
    """The no-op cache must not take a tampered wheel for fa's: it is set aside (kept) and written
    again, as any rebuild does (issue 36)."""
    path = build().path
    good = path.read_bytes()
    with path.open("ab") as f:
        f.write(b"tampered")
    assert build().path.read_bytes() == good
    kept = list(path.parent.glob(path.name + ".fa-changed-*"))
    assert [p.read_bytes() for p in kept] == [good + b"tampered"]


def test_an_unchanged_index_is_not_rewritten_and_a_removed_or_edited_page_is_noticed(
    build: Callable[[], package.BuiltWheel],
) -> None:
    out = build().path.parent
    data = index.write_index(out)
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.suffix in (".json", ".html"))
    states = {p: cache.file_state(p) for p in files}
    assert index.write_index(out) == data
    assert {p: cache.file_state(p) for p in files} == states  # not one file rewritten

    page = out / "simple" / "fa-attn" / "index.html"
    page.unlink()  # removed: written again
    assert index.write_index(out) == data
    assert page.is_file()

    (out / "index.json").write_text(json.dumps({"edited": True}))  # not fa's any more: refused, kept
    with pytest.raises(OutFileError, match=r"index\.json"):
        index.write_index(out)
    assert json.loads((out / "index.json").read_text()) == {"edited": True}


FAKE_CXX = """#!/bin/sh
echo run >> "$(dirname "$0")/runs"
case "$1" in
  -dumpfullversion) echo 99.1.0 ;;
  -dumpmachine) echo x86_64-linux-gnu ;;
  *) echo "fake g++ (FA test) 99.1.0" ;;
esac
"""


@pytest.mark.usefixtures("fresh_cache")
def test_the_compiler_is_asked_who_it_is_once_per_compiler_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from buildtool.builder import binding

    cxx = tmp_path / "fake-g++"
    cxx.write_text(FAKE_CXX)
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    runs = tmp_path / "runs"

    def asked() -> tuple[str, int]:
        binding._identity.cache_clear()  # a new fa process
        identity = binding.compiler_identity()
        return identity, len(runs.read_text().splitlines())

    assert asked() == ("fake g++ (FA test) 99.1.0 (99.1.0, x86_64-linux-gnu)", 3)
    assert asked()[1] == 3  # the stamp answered: g++ not run again
    cxx.write_text(FAKE_CXX.replace("99.1.0", "99.2.0"))  # an upgraded compiler: asked again
    assert asked() == ("fake g++ (FA test) 99.2.0 (99.2.0, x86_64-linux-gnu)", 6)


def test_a_cache_folder_removed_meanwhile_is_made_again_by_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cache_dir() makes the folder once per process (a no-op rebuild asks for it thousands of times):
    removed while fa runs, the next stamp or image written brings it back, and a read finds nothing."""
    monkeypatch.setenv("FA_CACHE", str(tmp_path / "c"))
    cache.write_stamp("elf-facts", "ab" * 32, {"x": 1})
    assert cache.read_stamp("elf-facts", "ab" * 32) == {"x": 1}
    shutil.rmtree(tmp_path / "c")
    assert cache.read_stamp("elf-facts", "ab" * 32) is None
    cache.write_stamp("elf-facts", "cd" * 32, {"y": 2})
    assert cache.read_stamp("elf-facts", "cd" * 32) == {"y": 2}
    assert cache.cache_dir() == tmp_path / "c"


# A cubin as cubin_fit reads it (kernel_needs: the sections, not the machine): `fa_fwd` with `threads`
# per block in its EIATTR_MAX_THREADS record and `smem` bytes of static shared memory, assembled by the
# real GNU assembler into a relocatable ELF.
CUBIN_ASM = """\
.section .nv.info.fa_fwd,"",@progbits
.byte 0x04, 0x05
.short 12
.long {threads}, 1, 1
.section .nv.shared.fa_fwd,"aw",@nobits
.zero {smem}
"""


def _cubin(path: Path, threads: int, smem: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.with_suffix(".s")
    source.write_text(CUBIN_ASM.format(threads=threads, smem=smem))
    subprocess.run(["as", str(source), "-o", str(path)], check=True)
    source.unlink()
    return path


def _cached_cubin(threads: int, smem: int) -> Path:
    """A cubin where the compile cache keeps them (kernels/<2>/<content key>.cubin)."""
    key = "ab" * 32
    return _cubin(cache.cache_dir() / "kernels" / key[:2] / f"{key}.cubin", threads, smem)


@pytest.mark.usefixtures("fresh_cache")
def test_elf_facts_of_a_cubin_edited_in_place_are_read_again() -> None:
    """The ELF facts are stamped, but a cubin changed since (even in the compile cache, whose file names
    are content keys) is parsed again: the stamp never answers for bytes it was not made from."""
    from buildtool.builder import cubin_fit

    path = _cached_cubin(threads=128, smem=1024)
    assert cubin_fit._needs_of(path)["fa_fwd"] == cubin_fit.KernelNeeds(1024, 0, 128)
    _cubin(path, threads=256, smem=2048)
    assert cubin_fit._needs_of(path)["fa_fwd"] == cubin_fit.KernelNeeds(2048, 0, 256)


@pytest.mark.usefixtures("fresh_cache")
@pytest.mark.parametrize("corrupt", [b"{not json", b'{"fa_fwd": "abc"}', b'{"kernels": {"fa_fwd": [1, 2]}}'])
def test_a_corrupt_elf_facts_stamp_is_ignored_and_written_again(corrupt: bytes) -> None:
    from buildtool.builder import cubin_fit

    path = _cached_cubin(threads=128, smem=1024)
    right = cubin_fit._needs_of(path)
    (stamp,) = (cache.cache_dir() / "stamps" / "elf-facts").rglob("*.json")
    stamp.write_bytes(corrupt)
    assert cubin_fit._needs_of(path) == right
    assert stamp.read_bytes() != corrupt  # written again, whole
    assert cubin_fit._needs_of(path) == right


def test_a_cached_image_edited_in_place_rebuilds_the_wheel(
    build: Callable[[], package.BuiltWheel], inputs: tuple[dict[CompileJob, Path], Path]
) -> None:
    """The wheel's stamp is keyed by each input's state, the compile cache's images too (their names
    are the content keys of what they are made from, not of their bytes): one edited there is packed
    again, not taken as unchanged."""
    images, _ = inputs
    moved = cache.cache_dir() / "kernels" / "cd" / ("cd" * 32 + ".cubin")
    moved.parent.mkdir(parents=True)
    moved.write_bytes(images[JOBS[0]].read_bytes())
    images[JOBS[0]] = moved
    assert build().manifest is not None
    assert build().manifest is None  # nothing changed
    moved.write_bytes(b"edited in the cache")
    rebuilt = build()
    assert rebuilt.manifest is not None
    with zipfile.ZipFile(rebuilt.path) as zf:
        assert zf.read("fa_attn/kernels/sm_80/fwd_fp16_d64.cubin") == b"edited in the cache"


def test_a_file_written_again_with_the_same_text_is_left_as_it_is(tmp_path: Path) -> None:
    """A build with nothing changed writes its log (logs/build-<cpu>.json) with the same text: neither
    the file nor the record of what fa wrote is touched (a backup or rsync sees no change)."""
    from buildtool.builder import out_files

    out_files.write_json(tmp_path, "logs/build.json", {"wheels": [1]})
    files = [tmp_path / "logs" / "build.json", tmp_path / out_files.RECORD]
    states = [cache.file_state(p) for p in files]
    out_files.write_json(tmp_path, "logs/build.json", {"wheels": [1]})
    assert [cache.file_state(p) for p in files] == states
    out_files.write_json(tmp_path, "logs/build.json", {"wheels": [2]})  # other text: written
    assert json.loads(files[0].read_text()) == {"wheels": [2]}
    assert cache.file_state(files[0]) != states[0]


def folder_states(out: Path) -> dict[Path, list[int] | None]:
    return {p: cache.file_state(p) for p in sorted(out.rglob("*")) if p.is_file()}


def local_build(out: Path, cwd: Path, kernels: Path) -> dict:
    """The summary (--json) of `fa build --local --out OUT` run from `cwd` on the kernels tree `kernels`."""
    env = {**os.environ, "FA_KERNELS_DIR": str(kernels)}
    proc = run_child(fa_command("build", "--local", "--out", str(out), "--json"), cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.network  # the CUDA 12 NVRTC wheel, once per machine
@pytest.mark.usefixtures("fresh_cache")
def test_a_build_with_nothing_changed_writes_nothing_and_notices_a_deleted_wheel_or_edited_cubin(
    tmp_path: Path, fixture_tree: Path
) -> None:
    """`fa build` again (the real command, a child process) leaves every file under --out as it was,
    the record of what fa wrote included; a wheel deleted since is built again and indexed, and a cubin
    edited in the compile cache is packed again (its sha256 in the index follows), not taken on trust."""
    (tmp_path / "matrix.yaml").write_text(TINY.format(archs='["8.0"]', dtypes="[fp16]"))
    out = tmp_path / "wheels"

    def fa_build() -> dict:
        return local_build(out, tmp_path, fixture_tree)

    first = fa_build()
    (wheel,) = out.glob("fa_attn-*.whl")
    states = folder_states(out)
    again = fa_build()
    assert again["nvrtc_compiles"] == again["cxx_compiles"] == 0
    assert folder_states(out) == states  # not one file rewritten: wheels, index, pages, log, record

    good = wheel.read_bytes()
    wheel.unlink()
    fa_build()
    assert wheel.read_bytes() == good  # built again, the same bytes
    listed = json.loads((out / "index.json").read_text())["wheels"]
    assert [w["file"] for w in listed] == [wheel.name]

    cubins = list((cache.cache_dir() / "kernels").rglob("*.cubin"))
    assert first["nvrtc_compiles"] >= 1
    assert cubins
    edited = cubins[0].read_bytes() + b"\0" * 16  # still an ELF, other bytes
    cubins[0].write_bytes(edited)
    fa_build()
    with zipfile.ZipFile(wheel) as zf:
        assert edited in [zf.read(n) for n in zf.namelist() if n.endswith(".cubin")]
    (entry,) = json.loads((out / "index.json").read_text())["wheels"]
    assert entry["sha256"] == sha256_file(wheel) != hashlib.sha256(good).hexdigest()
