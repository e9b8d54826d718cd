"""The kernel table's invariants, and real NVRTC compiles of a forward unit for each CUDA major.

The compiles use the pinned NVRTC wheel of each major (buildtool/builder/toolkits.py, fetched once into the
tool's cache; set FA_TOOLKIT_WHEELS to a folder with the wheels to skip the download) and check the
cubin's ELF header names the requested arch. They say nothing about numerical correctness: that is
for the GPU tests (tests/gpu), which need a device.
"""

from __future__ import annotations

import struct

import pytest

from buildtool.core import kernels_src
from buildtool.core.cuda_facts import TOOLKITS
from buildtool.core.runtime import versions

tiles = kernels_src.tiles()

EM_CUDA = 190
ALL_ARCHS = sorted({a for tk in TOOLKITS.values() for a in tk.archs}, key=versions.parse_target)
EVERY_HEAD_DIM = list(range(8, 257, 8))


def cubin_sm(image: bytes) -> int:
    """The SM number (e.g. 80) a cubin was built for. ELF ABI version 7 (CUDA 11/12 up to sm_90)
    keeps it in e_flags bits 0-7; version 8 (CUDA 12 for sm_100+, all of CUDA 13) in bits 8-15."""
    assert image[:4] == b"\x7fELF", "not an ELF image"
    assert image[4] == 2, "not a 64-bit ELF"
    (machine,) = struct.unpack_from("<H", image, 18)
    assert machine == EM_CUDA, f"e_machine {machine}, expected EM_CUDA ({EM_CUDA})"
    (flags,) = struct.unpack_from("<I", image, 48)
    abi_version = image[8]
    if abi_version == 7:
        return flags & 0xFF
    assert abi_version == 8, f"unknown CUDA ELF ABI version {abi_version}"
    return (flags >> 8) & 0xFF


# --- the table ----------------------------------------------------------------------------------


def test_every_arch_of_every_toolkit_has_a_family():
    for arch in ALL_ARCHS:
        assert tiles.arch_family(arch) is not None, arch
        assert tiles.table_units(arch), arch  # (sm_90a's are built once csrc/hopper_fwd.cu is in the tree)


def test_archs_below_min_arch_or_unknown_have_no_units():
    assert tiles.MIN_ARCH == "7.5"
    assert tiles.MIN_ARCH == versions.KERNEL_ARCH_FLOOR  # the runtime's copy, for its V100 answer
    for arch in ("7.0", "6.1", "5.2", "99.0"):
        assert tiles.units(arch) == []


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_every_launch_fits_its_arch_shared_memory(arch):
    limit = tiles.SMEM_LIMIT[arch]
    for unit in tiles.units(arch):
        for entry, launch in unit.entries.items():
            assert launch.smem_bytes <= limit, f"{unit.name}.{entry} on {arch}: {launch.smem_bytes} > {limit}"
            assert launch.threads % 32 == 0, (unit.name, entry)
            assert 32 <= launch.threads <= 1024, (unit.name, entry)
            assert launch.grid in ("q_blocks", "k_blocks", "q_blocks_splits"), (unit.name, entry)


def test_smem_limits_match_the_published_figures():
    kib = {
        arch: tiles.SMEM_LIMIT[arch] // 1024 for arch in ("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0")
    }
    assert kib == {"7.5": 64, "8.0": 163, "8.6": 99, "8.9": 99, "9.0": 227, "10.0": 227, "12.0": 99}


def test_turing_builds_fp16_only():
    assert {u.dtype for u in tiles.units("7.5")} == {"fp16"}
    assert all(u.defines["FA_DTYPE_BF16"] == 0 for u in tiles.units("7.5"))
    assert {u.dtype for u in tiles.units("8.0")} == {"fp16", "bf16"}


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_forward_buckets_cover_every_head_dim_once(arch):
    for dtype in tiles.arch_family(arch).dtypes:
        fwd = [u for u in tiles.table_units(arch) if u.direction == "fwd" and u.dtype == dtype]
        served = sorted(d for u in fwd for d in tiles.head_dims(u))
        assert served == EVERY_HEAD_DIM, (arch, dtype)


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_units_are_unique_and_consistent(arch):
    units = tiles.units(arch)
    assert len({u.name for u in units}) == len(units)
    for u in units:
        assert u.head_dim in (tiles.HOPPER_HEAD_DIMS if u.arch_specific else tiles.HEAD_DIM_BUCKETS)
        assert u.defines["FA_HEAD_DIM"] == u.head_dim
        assert u.defines["FA_DTYPE_BF16"] == int(u.dtype == "bf16")
        assert u.name == f"{u.direction}_{u.dtype}_d{u.head_dim}"
        assert (kernels_src.kernels_dir() / u.source).is_file()
    for u in (
        u for u in units if u.direction == "fwd" and not u.arch_specific
    ):  # (sm_90a: test_hopper_units)
        (launch,) = u.entries.values()
        assert list(u.entries) == ["fa_fwd"]
        assert launch.grid == "q_blocks"
        assert launch.threads == 32 * u.defines["FA_WARPS"]
        assert (launch.block_m, launch.block_n) == (u.defines["FA_BLOCK_M"], u.defines["FA_BLOCK_N"])
        # fwd.cu: every warp owns whole 16-row mma tiles; shared memory as the kernel lays it out
        assert launch.block_m % (16 * u.defines["FA_WARPS"]) == 0
        assert launch.block_n % 16 == 0
        assert launch.smem_bytes == u.defines["FA_SMEM_BYTES"]
    for u in (u for u in units if u.direction == "splitkv"):
        assert list(u.entries) == ["fa_fwd_splitkv", "fa_fwd_combine"]
        assert u.defines["FA_SPLITKV"] == 1
        assert u.entries["fa_fwd_splitkv"].grid == "q_blocks_splits"
        assert u.entries["fa_fwd_combine"].block_m == tiles.COMBINE_ROWS


def test_head_dims_of_a_unit():
    by_dim = {u.head_dim: u for u in tiles.units("8.0") if u.direction == "fwd" and u.dtype == "fp16"}
    assert tiles.head_dims(by_dim[32]) == [8, 16, 24, 32]
    assert tiles.head_dims(by_dim[64]) == [40, 48, 56, 64]
    # no d224 bucket (FlashAttention-2 has none): the d256 unit runs every head dim above 192
    assert tiles.head_dims(by_dim[256]) == list(range(200, 257, 8))


def test_units_skip_missing_sources(tmp_path, monkeypatch):
    monkeypatch.setattr(tiles, "_KERNELS_DIR", tmp_path)
    assert tiles.units("8.0") == []


def test_features_are_declared():
    assert tiles.FEATURES >= {"causal", "gqa", "varlen"}
    assert all(isinstance(f, str) for f in tiles.FEATURES)


# --- real compiles ------------------------------------------------------------------------------

# One small forward unit per CUDA major, on an arch that exercises a different code path each time:
# Turing's m16n8k8 + register-staged copies, Ampere bf16 + cp.async, and a CUDA 13 ABI-v8 cubin;
# plus the backward unit that must fit the 99 KB of sm86 at head dim 256, and two at FA2's tiles whose
# dQ adds spilled before they shared one pointer per lane (bwd.cu accumulate_dq): sm86's d128 in one
# dQ pass (8 B with NVRTC 11.8) and sm100's 64 x 64 at d192 (32 B with NVRTC 12.9); and sm80's 64 x 64
# at d256, whose dQ takes two column passes (one spills 152 B with NVRTC 12.9); sm86's d96 64 x 128 in
# one dQ pass, its step's addresses rebased and dQ first (116 B stored with neither, NVRTC 12.9), and
# its d256 with dQ in chunks (296 B of spill stores and loads in one pass); sm86's d192 with K's
# fragments of S in registers beside V's (NVRTC 12.9), and CUDA 11's own d192 (11.8 spills the default
# 56 + 56 B). Each major compiles its own tiles (tiles.units(arch, major)).
COMPILES = [
    (11, "7.5", "fwd_fp16_d32"),
    (12, "8.0", "fwd_bf16_d32"),
    (13, "12.0", "fwd_fp16_d32"),
    (12, "8.6", "bwd_bf16_d256"),
    (11, "8.6", "bwd_bf16_d128"),
    (12, "10.0", "bwd_bf16_d192"),
    (11, "8.0", "bwd_fp16_d256"),
    (12, "8.6", "bwd_bf16_d96"),
    (12, "8.6", "bwd_bf16_d192"),
    (11, "8.6", "bwd_fp16_d192"),
]


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.parametrize(("major", "arch", "unit_name"), COMPILES)
def test_unit_compiles_to_a_cubin_for_its_arch(major, arch, unit_name):
    import locale

    from buildtool.builder import cubin_fit, toolkits
    from buildtool.builder.nvrtc import open_nvrtc, parse_resource_usage

    unit = next(u for u in tiles.units(arch, major) if u.name == unit_name)
    kdir = kernels_src.kernels_dir()
    headers = {p.name: p.read_text() for p in (kdir / "csrc").iterdir() if p.suffix in (".h", ".cuh")}
    options = [*tiles.nvrtc_options(arch), *(f"-D{k}={v}" for k, v in unit.defines.items()), "-Xptxas=-v"]
    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(major)))
    assert nvrtc.version[0] == major

    encoding = locale.getpreferredencoding(False)
    out = nvrtc.compile(
        (kdir / unit.source).read_text(), unit.source, "sm_" + arch.replace(".", ""), options, headers
    )

    # NVRTC 11.8 leaves its thread in the C locale; buildtool/builder/nvrtc.py must put Python's encoding back.
    assert locale.getpreferredencoding(False) == encoding
    assert out.kind == "cubin"
    assert cubin_sm(out.image) == int(arch.replace(".", ""))
    usages = {u.kernel: u for u in parse_resource_usage(out.log)}
    assert set(usages) == set(unit.entries)
    for entry, launch in unit.entries.items():
        usage = usages[entry]
        assert usage.spill_stores == 0, out.log
        assert usage.spill_loads == 0, out.log
        assert usage.static_smem + launch.smem_bytes <= tiles.SMEM_LIMIT[arch]

    # The cubin's ELF as the build reads it (cubin_fit): ptxas's registers and launch bounds, and the
    # static shared memory ptxas -v leaves out (1 KiB in every sm90+ kernel), within the arch's limit.
    needs = cubin_fit.kernel_needs(out.image)
    assert set(needs) == set(unit.entries)
    family = tiles.arch_family(arch)
    for entry, launch in unit.entries.items():
        assert needs[entry].registers == usages[entry].registers, entry
        assert needs[entry].max_threads == launch.threads, entry
        assert needs[entry].static_smem == family.static_smem, entry
        assert needs[entry].static_smem + launch.smem_bytes <= tiles.SMEM_LIMIT[arch]


# --- the autotuner's search space ---------------------------------------------------------------


@pytest.mark.parametrize("arch", ["7.5", "8.0", "8.6", "9.0", "12.0"])
def test_candidates_start_with_the_default_and_fit(arch):
    family = tiles.arch_family(arch)
    for direction in tiles.DIRECTIONS:
        for d in tiles.HEAD_DIM_BUCKETS:
            rows = tiles.candidates(arch, direction, d)
            default = tiles.default_tile(arch, direction, d)
            if default is None:
                assert rows == [], (arch, direction, d)
                continue
            assert rows[0] == default, (arch, direction, d)
            assert len({t.label for t in rows}) == len(rows), "labels must be unique"
            for tile in rows:
                assert tile.valid(d), (arch, tile.label)
                assert tile.smem_bytes(d) <= family.smem_limit, (arch, tile.label)
                u = tiles.unit(arch, direction, family.dtypes[0], d, tile)
                assert u.defines["FA_SMEM_BYTES"] == tile.smem_bytes(d)
                main = next(iter(u.entries.values()))  # the combine of split-KV has its own size
                assert main.threads == 32 * tile.warps


def test_units_are_built_from_the_default_tiles():
    for u in tiles.units("8.0"):
        assert u == tiles.unit(
            "8.0", u.direction, u.dtype, u.head_dim, tiles.default_tile("8.0", u.direction, u.head_dim)
        )


def test_candidates_take_any_head_dim_and_refuse_bad_input():
    assert tiles.candidates("8.0", "fwd", 72) == tiles.candidates("8.0", "fwd", 96)
    with pytest.raises(ValueError, match="arch"):
        tiles.candidates("6.1", "fwd", 64)
    with pytest.raises(ValueError, match="direction"):
        tiles.candidates("8.0", "sideways", 64)
    with pytest.raises(ValueError, match="head_dim"):
        tiles.candidates("8.0", "fwd", 512)
    too_big = tiles.FwdTile(128, 128, 4)
    with pytest.raises(ValueError, match="shared memory"):
        tiles.unit("7.5", "fwd", "fp16", 256, too_big)
    with pytest.raises(TypeError, match="cannot build"):
        tiles.unit("8.0", "bwd", "fp16", 64, too_big)


def test_the_previous_tiles_stay_candidates():
    """The first kernels' tiles remain in the search space, so the GPU measures old against new."""
    for arch in ("7.5", "8.0", "8.6", "9.0"):
        family = tiles.arch_family(arch)
        for direction, table in family.previous.items():
            for d, tile in table.items():
                if tile.smem_bytes(d) <= family.smem_limit:
                    assert tile in tiles.candidates(arch, direction, d), (arch, direction, d, tile.label)
