"""Which check problem covers which branch of the kernels: the coverage table of docs/checking.md.

The kernels branch on two things only: the fields of FaParams (params.h; device code reads them as
`p.X` / `params.X`) and the compile-time knobs: FA_* names in preprocessor conditions (`#if FA_X`, the
per-arch ones of primitives.cuh) and every -D define tiles.py gives a unit (`if constexpr` switches,
e.g. the sm_90a forward's FA_CONSUMER_WGS). A feature an arch's units do not implement (tiles.features,
e.g. an arch without paged KV) is not applicable there, and its problems are not in those units' list. `FEATURES` below declares, per feature, the fields
and knobs that implement it and which problems exercise it (a predicate on fa_attn.check's problems).
`gaps` holds the declaration to the source: a field or knob the source uses that no feature claims, or
a feature that some unit's problems never exercise, is a gap, and tests/runtime/test_check_coverage.py
fails on any. So a new branch in the kernels fails CI until a problem covers it.

    python -m buildtool.emucheck.coverage            # print the table (and any gap; exit 1 if one)
    python -m buildtool.emucheck.coverage --record   # write it into docs/checking.md
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fa_attn.verify.check import problems
from fa_attn.verify.reference import visible_rows
from fa_attn.verify.unitcheck import NO_WINDOW, Problem

from buildtool.core import atomic
from buildtool.core.kernels_src import tiles

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "kernels" / "csrc"
CHECKING = REPO / "docs" / "checking.md"
DIRECTIONS = ("fwd", "splitkv", "bwd")
SECTION = "coverage"
COMMAND = "python -m buildtool.emucheck.coverage --record"


@dataclass(frozen=True)
class Tile:
    """What a predicate may ask of the unit: its bucket and its main entry's blocks."""

    head_dim: int
    block_m: int
    block_n: int
    lowest_head_dim: int  # the smallest head dim the unit serves (tiles.head_dims)


Covers = Callable[[Problem, Tile], bool]


@dataclass(frozen=True)
class Feature:
    name: str
    fields: tuple[str, ...]  # FaParams fields that implement it
    knobs: tuple[str, ...]  # FA_* defines that switch it
    covers: Covers  # does a problem exercise it
    directions: tuple[str, ...] = DIRECTIONS  # where it exists (the others: not applicable)
    per_unit: bool = False  # a compile-time choice: each unit is built one way, every unit is checked
    needs: str = ""  # the tiles.FEATURES name it implements: n/a on an arch whose units lack it
    arches: tuple[str, ...] = ()  # the arches whose units have it (all when empty)


def _blocks(p: Problem, t: Tile) -> bool:
    """At least two query and three key blocks, the last of each partial (in some sequence)."""
    return any(
        sq > t.block_m and sq % t.block_m and sk > 2 * t.block_n and sk % t.block_n
        for sq, sk in p.sequences()
    )


def _no_key_rows(p: Problem, _t: Tile) -> bool:
    cpu = torch.device("cpu")
    return any(
        sq and not bool(visible_rows(sq, sk, p.causal, cpu, p.window).all()) for sq, sk in p.sequences()
    )


def _group(n: int, mqa: bool = False) -> Covers:
    return lambda p, _t: p.heads // p.heads_k == n and (p.heads_k == 1) == mqa


def _splits_of(p: Problem, t: Tile) -> bool:
    """Split-KV with at least two query blocks and two shares that each hold a key block."""
    sq, sk = p.sequences()[0]
    return sq > t.block_m and p.splits >= 2 and -(-sk // t.block_n) >= p.splits


def _empty_share(p: Problem, t: Tile) -> bool:
    return any(p.splits > -(-sk // t.block_n) for _, sk in p.sequences())


def _always(_p: Problem, _t: Tile) -> bool:
    return True


KV = ("fwd", "splitkv")  # the KV-cache layouts: inference only (no KV-cache backward)
STRIDES = tuple(
    f"{t}_{s}_stride" for t in ("q", "k", "v", "o", "do", "dq", "dk", "dv") for s in ("batch", "row", "head")
)

FEATURES: tuple[Feature, ...] = (
    Feature(
        "several query and key blocks, partial last tiles",
        ("seqlen_q", "seqlen_k", "seqlen_q_rounded", "seqlen_k_rounded"),
        ("FA_BLOCK_M", "FA_BLOCK_N"),
        _blocks,
    ),
    Feature("padded batch >= 2", ("batch",), (), lambda p, _t: p.layout == "padded" and p.batch >= 2),
    Feature("causal (bottom-right)", ("is_causal",), (), lambda p, _t: p.causal),
    Feature("rows that see no key", (), (), _no_key_rows),
    Feature("GQA group 1", ("heads",), (), _group(1)),
    Feature("GQA group 2", ("heads_k",), (), _group(2)),
    Feature("GQA group 4", (), (), _group(4)),
    Feature("GQA group 8, MQA", (), (), _group(8, mqa=True)),
    Feature("head dim = bucket", (), ("FA_HEAD_DIM",), lambda p, t: p.head_dim == t.head_dim),
    Feature(
        "head dim below bucket, odd multiple of 8",
        ("head_dim",),
        (),
        lambda p, t: p.head_dim < t.head_dim and p.head_dim % 16 == 8,
    ),
    Feature(
        "head dim below bucket, multiple of 16",
        (),
        (),
        lambda p, t: p.head_dim < t.head_dim and p.head_dim % 16 == 0,
    ),
    Feature(
        "softmax_scale not 1/sqrt(d)",
        ("scale_softmax", "scale_softmax_log2"),
        (),
        lambda p, _t: p.scale is not None,
    ),
    Feature(
        "window, left only",
        ("window_left",),
        (),
        lambda p, _t: p.window[0] >= 0 > p.window[1] and not p.causal,
    ),
    Feature("window, right only", ("window_right",), (), lambda p, _t: p.window[1] >= 0 > p.window[0]),
    Feature("window, both sides", (), (), lambda p, _t: min(p.window) >= 0),
    Feature("window with causal", (), (), lambda p, _t: p.causal and p.window != NO_WINDOW),
    Feature("softcap", ("softcap",), (), lambda p, _t: p.softcap > 0),
    Feature("varlen", ("cu_seqlens_q", "cu_seqlens_k"), (), lambda p, _t: p.layout == "varlen"),
    Feature(
        "varlen sequence without queries",
        (),
        (),
        lambda p, _t: p.layout == "varlen" and any(sq == 0 for sq, _ in p.sequences()),
    ),
    Feature(
        "varlen sequence without keys",
        (),
        (),
        lambda p, _t: p.layout == "varlen" and any(sk == 0 < sq for sq, sk in p.sequences()),
    ),
    Feature("seqused_k", ("seqused_k",), (), lambda p, _t: p.layout in ("kvcache", "paged"), KV),
    Feature("leftpad_k", ("leftpad_k",), (), lambda p, _t: p.leftpad, KV),
    Feature("cache_batch_idx", ("kv_batch_idx",), (), lambda p, _t: p.cache_rows, KV),
    Feature(
        "paged KV, one key block per page",
        ("block_table", "block_table_batch_stride", "page_block_size"),
        (),
        lambda p, t: p.layout == "paged" and p.page_size == t.block_n,
        KV,
        needs="paged_kv",
    ),
    Feature(
        "paged KV, several key blocks per page",
        (),
        (),
        lambda p, t: p.layout == "paged" and p.page_size >= 2 * t.block_n,
        KV,
        needs="paged_kv",
    ),
    Feature(
        "split-KV, >= 2 query blocks x >= 2 shares, combine",
        ("num_splits", "o_accum", "lse_accum"),
        ("FA_SPLITKV",),
        _splits_of,
        ("splitkv",),
    ),
    Feature("split-KV share without keys", (), (), _empty_share, ("splitkv",)),
    Feature(
        "backward workspaces (dq_accum, row sums)",
        ("dout", "dq", "dk", "dv", "dq_accum", "dsoftmax_sum"),
        (),
        _always,
        ("bwd",),
    ),
    Feature(
        "tensors and strides",
        ("q", "k", "v", "o", "lse", *STRIDES),
        (),
        _always,
    ),
    Feature(
        "per-unit tiles: stages, Q or V in registers, warps, backward layout, dQ passes and addressing",
        (),
        (
            "FA_STAGES",
            "FA_Q_IN_REGS",
            "FA_V_IN_REGS",
            "FA_WARPS",
            "FA_SMEM_BYTES",
            "FA_BWD_SWIZZLE",
            "FA_DQ_PASSES",
            "FA_S_ROWS",
            "FA_DQ_LANE_POINTER",
            "FA_DQ_HOLD_DS",
            "FA_BWD_REBASE",
            "FA_DQ_FIRST",
            "FA_K_IN_REGS",
        ),
        _always,
        per_unit=True,
    ),
    Feature("dtype fp16 / bf16", (), ("FA_DTYPE_BF16",), _always, per_unit=True),
    Feature("per-arch copies", (), ("FA_HAS_CP_ASYNC",), _always, per_unit=True),
    Feature(
        "sm_90a consumer warpgroups: 3 (one GEMM at a time), 2 (S overlapped with P V)",
        (),
        ("FA_CONSUMER_WGS",),
        _always,
        ("fwd",),
        per_unit=True,
        arches=("9.0a",),
    ),
)

# ---- what the source uses --------------------------------------------------------------------------

_GUARD = re.compile(r"_(?:H|CUH)_$")


def params_fields(csrc: Path = CSRC) -> set[str]:
    """FaParams' fields, from params.h."""
    text = (csrc / "params.h").read_text()
    body = text[text.index("typedef struct FaParams {") : text.index("} FaParams;")].split("{", 1)[1]
    body = re.sub(r"//[^\n]*", "", body)
    names: set[str] = set()
    for decl in body.split(";"):  # "fa_i64 a, b" / "const void* q": the names before each comma and the end
        names |= set(re.findall(r"(\w+)\s*(?=,|$)", decl.strip()))
    return names


def read_fields(csrc: Path = CSRC) -> set[str]:
    """FaParams fields the device code reads (`p.X`, `params.X`)."""
    found: set[str] = set()
    for src in sorted(csrc.glob("*.cu*")):
        found |= set(re.findall(r"\b(?:p|params)\.(\w+)", src.read_text()))
    return found & params_fields(csrc)


def knobs(csrc: Path = CSRC, arches: tuple[str, ...] = ()) -> set[str]:
    """FA_* names in preprocessor conditions (not include guards), and the -D defines of the units of
    `arches` (tiles.py), in every CUDA major's tiles."""
    found = {name for arch in arches for u in _every_major(arch) for name in u.defines}
    for src in sorted(csrc.glob("*")):
        for line in src.read_text().splitlines():
            if re.match(r"\s*#\s*(?:if|ifdef|ifndef|elif)\b", line):
                found |= {n for n in re.findall(r"\bFA_[A-Z0-9_]+", line) if not _GUARD.search(n)}
    return found


# ---- coverage --------------------------------------------------------------------------------------


def applies(feature: Feature, arch: str, direction: str) -> bool:
    """Does `feature` exist in `arch`'s units of `direction`."""
    return (
        direction in feature.directions
        and (not feature.arches or arch in feature.arches)
        and (not feature.needs or feature.needs in tiles().features(arch))
    )


def paged(arch: str) -> bool:
    """Do `arch`'s units read paged KV (else their problem lists have no paged problem)."""
    return "paged_kv" in tiles().features(arch)


def _every_major(arch: str) -> list[Any]:
    """The units of `arch` with the default tiles, then those a CUDA major compiles with a tile of its
    own (tiles.own_majors; named "<unit> (CUDA <major>)")."""
    table = tiles()
    out = list(table.units(arch))
    for cuda in table.own_majors(arch):
        default = {u.name: u.tile for u in out}
        out += [
            dataclasses.replace(u, name=f"{u.name} (CUDA {cuda})")
            for u in table.units(arch, cuda)
            if default.get(u.name) != u.tile
        ]
    return out


def unit_tiles(arch: str) -> list[tuple[str, str, Tile]]:
    """(unit name, direction, tile) of every unit of `arch`, each CUDA major's own tiles too."""
    out = []
    for u in _every_major(arch):
        main = max(u.entries.values(), key=lambda e: e.block_n)
        tile = Tile(u.head_dim, main.block_m, main.block_n, tiles().head_dims(u)[0])
        out.append((u.name, u.direction, tile))
    return out


def covering(
    feature: Feature, direction: str, tile: Tile, dtype: torch.dtype = torch.float16, arch: str = "8.0"
) -> list[str]:
    """Names of the emulated problems of a unit (direction, tile) of `arch` that exercise the feature."""
    chosen = problems(
        dtype, tile.head_dim, direction, tile.block_n, False, tile.block_m, paged(arch),
        lowest_head_dim=tile.lowest_head_dim,
    )  # fmt: skip
    return [p.name for p in chosen if feature.covers(p, tile)]


def gaps(
    csrc: Path = CSRC, arches: tuple[str, ...] = ("7.5", "8.0", "8.6", "9.0", "9.0a", "10.0", "12.0"),
    features: tuple[Feature, ...] = FEATURES,
) -> list[str]:  # fmt: skip
    """Every way the declaration and the source disagree, as messages naming the fix ([] when none)."""
    out = []
    claimed_fields = {f for feat in features for f in feat.fields}
    claimed_knobs = {k for feat in features for k in feat.knobs}
    for name in sorted((params_fields(csrc) | read_fields(csrc)) - claimed_fields):
        out.append(
            f"FaParams field {name} (kernels/csrc/params.h): no feature claims it; add it to a Feature in "
            "buildtool/emucheck/coverage.py, with a problem in fa_attn/verify/check.py problems() that covers it"
        )
    for name in sorted(knobs(csrc, arches) - claimed_knobs):
        out.append(
            f"compile-time branch {name} (kernels/csrc): no feature claims it; add it to a Feature in "
            "buildtool/emucheck/coverage.py, with a problem that covers it"
        )
    for arch in arches:
        for unit, direction, tile in unit_tiles(arch):
            for feat in features:
                if applies(feat, arch, direction) and not covering(feat, direction, tile, arch=arch):
                    out.append(
                        f"sm {arch} {unit}: no problem covers '{feat.name}'; add one to fa_attn/verify/check.py "
                        "problems()"
                    )
    return out


def table(arch: str = "8.0", dtype: str = "fp16", head_dim: int = 64) -> str:
    """The coverage table (markdown) for the units of one arch, dtype and bucket."""
    units = {
        d: (name, t) for name, d, t in unit_tiles(arch) if name.split("_")[1:] == [dtype, f"d{head_dim}"]
    }
    head = [
        "feature", "FaParams fields / knobs",
        *(f"{units[d][0]} problems" if d in units else f"{d} (no unit)" for d in DIRECTIONS),
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for feat in FEATURES:
        what = ", ".join(f"`{x}`" for x in (*feat.fields, *feat.knobs)) or "(a shape)"
        if len(feat.fields) > 6:
            what = ", ".join(f"`{x}`" for x in feat.fields[:5]) + f", ... ({len(feat.fields)} fields)"
        cells = []
        for d in DIRECTIONS:
            if d not in units or not applies(feat, arch, d):
                cells.append("n/a")
            elif feat.per_unit:
                cells.append("every unit (tiles.py)")
            else:
                names = covering(feat, d, units[d][1], arch=arch)
                cells.append(", ".join(names[:4]) + (f" (+{len(names) - 4})" if len(names) > 4 else ""))
        lines.append("| " + " | ".join([feat.name, what, *cells]) + " |")
    return "\n".join(lines)


def section_text() -> str:
    return (
        textwrap.fill(
            f"Generated by `{COMMAND}` from kernels/csrc and fa_attn/verify/check.py (sm 8.0, fp16, head dim 64; "
            "the other units differ only in their tile sizes, and every unit of every arch is held to the "
            "same table by tests/runtime/test_check_coverage.py).",
            105,
        )
        + "\n\n"
        + table()
        + "\n\n"
        + textwrap.fill(
            "The sm_90a forward (hopper_fwd.cu; `fa check --emulate --arch 9.0a`), fp16, head dim 64: a forward "
            "only, so the split-KV and backward rows are n/a; its paged problems load each key block from its "
            "page by TMA (pages of one and of two key blocks).",
            105,
        )
        + "\n\n"
        + table("9.0a")
    )


_BLOCK = re.compile(r"(<!-- begin coverage -->\n).*?(<!-- end coverage -->)", re.DOTALL)


def recorded(doc: Path = CHECKING) -> str | None:
    m = re.search(r"<!-- begin coverage -->\n(.*?)\n<!-- end coverage -->", doc.read_text(), re.DOTALL)
    return m.group(1) if m else None


def record(doc: Path = CHECKING) -> None:
    text = doc.read_text()
    if not _BLOCK.search(text):
        raise SystemExit(f"{doc}: no <!-- begin coverage --> ... <!-- end coverage --> section")
    atomic.write_text(doc, _BLOCK.sub(lambda m: m.group(1) + section_text() + "\n" + m.group(2), text))
    print(f"recorded the coverage table in {doc}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m buildtool.emucheck.coverage", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--record", action="store_true", help="write the table into docs/checking.md")
    args = parser.parse_args(argv)
    found = gaps()
    print(section_text())
    for gap in found:
        print(f"gap: {gap}", file=sys.stderr)
    if args.record and not found:
        record()
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
