"""decision.decide picks a tile by the GPU's opt-in shared memory per block, static shared memory
counted: the default where it fits, else the largest alternative that fits, else a fallback whose
reason names the need and the GPU's limit; split-KV that cannot run is a note, never silent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fa_attn.runtime.decision import Call, Device, decide, fitting_tile
from fa_attn.schema import Coverage, Manifest

# An sm_80 image's head dim 256 forward: its default tile (sm80's 163 KB) and the alternative sized for
# the 99 KB parts (tiles.alternative_units), as the packager writes them.
DEFAULT = ("m128n64w8s1", 131072)
SMALLER = ("m64n64w4s1", 98304)
SM86_LIMIT = 101376  # 99 KiB: sm 8.6/8.9/12.x (CUDA C++ Programming Guide)


def row(
    arch: str, tile: str, smem: int, image: str = "sass", direction: str = "fwd", static: int = 0
) -> dict:
    return {
        "arch": arch,
        "image": image,
        "dtype": "bf16",
        "direction": direction,
        "head_dims": [248, 256],
        "smem_bytes": smem,
        "static_smem": static,
        "tile": tile,
    }


def kernel(
    arch: str, tile: str, smem: int, image: str = "sass", direction: str = "fwd", static: int = 0
) -> dict:
    entry = "fa_fwd_splitkv" if direction == "splitkv" else "fa_fwd"
    where = f"sm_{arch.replace('.', '')}" if image == "sass" else f"compute_{arch.replace('.', '')}"
    return {
        "arch": arch,
        "image": image,
        "file": f"kernels/{where}/{direction}_bf16_d256_{tile}",
        "unit": f"{direction}_bf16_d256",
        "dtype": "bf16",
        "direction": direction,
        "head_dim": 256,
        "tile": tile,
        "entries": {
            entry: {
                "threads": 128,
                "block_m": 64,
                "block_n": 64,
                "smem_bytes": smem,
                "static_smem": static,
                "grid": "q_blocks_splits" if direction == "splitkv" else "q_blocks",
            }
        },
    }


def manifest(rows: list[dict], kernels: list[dict], ptx: str | None = None) -> Manifest:
    data: dict[str, Any] = {
        "schema": 1,
        "schema_minor": 4,
        "version": "0.1.0",
        "cuda_major": 12,
        "binding": "libfa_attn_ops.so",
        "ptx": ptx,
        "coverage": rows,
        "kernels": kernels,
    }
    return Manifest.from_json(data)


SM80_ONLY = manifest(
    [row("8.0", *DEFAULT), row("8.0", *SMALLER)],
    [kernel("8.0", *DEFAULT), kernel("8.0", *SMALLER)],
)


def run(man: Manifest, sm: str, limit: int | None, backward: bool = False) -> Any:
    return decide(man.info, Device("cuda", sm, limit), Call("bf16", 256, backward), man.kernels, Path("/pkg"))


def test_an_alternative_runs_where_the_default_does_not_fit() -> None:
    """main fell back here: the sm_80 image's largest need (131072 B) against the 99 KiB part."""
    d = run(SM80_ONLY, "8.6", SM86_LIMIT)
    assert (d.path, d.arch, d.reasons) == ("sass", "8.0", ())
    assert d.tiles == (("fwd", SMALLER[0]),)
    assert d.fwd is not None
    assert d.fwd.module.endswith(SMALLER[0])
    assert d.fwd.launch[4] == SMALLER[1]  # the launch's dynamic shared memory is the alternative's


def test_the_default_runs_where_it_fits() -> None:
    d = run(SM80_ONLY, "8.0", 163 * 1024)
    assert d.tiles == (("fwd", DEFAULT[0]),)
    assert d.fwd is not None
    assert d.fwd.launch[4] == DEFAULT[1]


def test_limits_just_above_and_below_each_tile() -> None:
    for tile, need in (DEFAULT, SMALLER):
        assert run(SM80_ONLY, "8.6", need).tiles == (("fwd", tile),), need
    assert run(SM80_ONLY, "8.6", DEFAULT[1] - 1).tiles == (("fwd", SMALLER[0]),)
    below = run(SM80_ONLY, "8.6", SMALLER[1] - 1)
    assert below.path == "fallback"
    assert [r.code for r in below.reasons] == ["arch-unsupported"]
    assert str(SMALLER[1]) in below.reasons[0].message  # the least any tile needs
    assert str(SMALLER[1] - 1) in below.reasons[0].message  # what the GPU offers


def test_an_unknown_limit_takes_the_default() -> None:
    assert run(SM80_ONLY, "8.6", None).tiles == (("fwd", DEFAULT[0]),)


def test_static_shared_memory_counts() -> None:
    """A PTX tile of exactly 99 KiB dynamic carries ptxas's 1 KiB of static shared memory when the
    driver JITs it for sm 12.0: it does not launch within 99 KiB, which main's fit (dynamic only)
    said it would."""
    need = SM86_LIMIT
    man = manifest(
        [row("8.6", "m64n64w4s2", need, image="ptx", static=1024)],
        [kernel("8.6", "m64n64w4s2", need, image="ptx", static=1024)],
        ptx="8.6",
    )
    d = run(man, "12.0", SM86_LIMIT)
    assert d.path == "fallback"
    assert f"{need + 1024} ({need} dynamic + 1024 static)" in d.reasons[0].message
    assert f"offers {SM86_LIMIT}" in d.reasons[0].message
    assert run(man, "12.0", need + 1024).path == "ptx"


def test_fitting_tile_is_the_largest_within_the_limit() -> None:
    rows = [
        Coverage("8.0", "sass", "bf16", "fwd", (256,), smem, 1024, tile) for tile, smem in (DEFAULT, SMALLER)
    ]
    assert fitting_tile(rows, None) == rows[0]
    assert fitting_tile(rows, SMALLER[1] + 1024) == rows[1]
    assert fitting_tile(rows, SMALLER[1] + 1023) is None


def test_split_kv_that_does_not_fit_is_a_note() -> None:
    """main dropped the split-KV kernel without a word when it did not fit the GPU."""
    big = ("m64n128w4s2", 110000)
    man = manifest(
        [row("8.0", *SMALLER), row("8.0", *big, direction="splitkv")],
        [kernel("8.0", *SMALLER), kernel("8.0", *big, direction="splitkv")],
    )
    d = run(man, "8.6", SM86_LIMIT)
    assert (d.path, d.splitkv) == ("sass", None)
    assert [n.code for n in d.notes] == ["splitkv-unavailable"]
    assert "110000" in d.notes[0].message
    assert str(SM86_LIMIT) in d.notes[0].message
    fits = run(man, "8.0", 163 * 1024)
    assert fits.splitkv is not None
    assert fits.notes == ()
    assert dict(fits.tiles)["splitkv"] == big[0]


def test_split_kv_missing_for_a_head_dim_is_a_note() -> None:
    man = manifest(
        [row("8.0", *SMALLER), {**row("8.0", *SMALLER, direction="splitkv"), "head_dims": [64]}],
        [kernel("8.0", *SMALLER)],
    )
    d = run(man, "8.6", SM86_LIMIT)
    assert d.path == "sass"
    assert [n.code for n in d.notes] == ["splitkv-unavailable"]
    assert "head dim 256" in d.notes[0].message


def test_a_backward_call_needs_no_split_kv() -> None:
    man = manifest(
        [row("8.0", *SMALLER), row("8.0", *SMALLER, direction="bwd")],
        [kernel("8.0", *SMALLER), kernel("8.0", *SMALLER, direction="bwd")],
    )
    d = run(man, "8.6", SM86_LIMIT, backward=True)
    assert (d.path, d.notes) == ("sass", ())
    assert d.tiles == (("fwd", SMALLER[0]), ("bwd", SMALLER[0]))
