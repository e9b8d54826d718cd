"""A static cost model of the kernels, read from their SASS: no GPU, no timing.

    python bench/kernels/kernel_model.py                          # today's default units, sm 8.0 / 8.6 / 9.0
    python bench/kernels/kernel_model.py --before ffc809d         # side by side with the kernels of a git revision
    python bench/kernels/kernel_model.py --arch 9.0 --head-dim 128 --json out.json

For each unit's main entry (fa_fwd, fa_bwd, fa_fwd_splitkv) this compiles the unit with a pinned NVRTC
(buildtool, CUDA 12 by default), disassembles the cubin with nvdisasm from NVIDIA's PyPI wheel (pinned
by file and sha256 below, fetched once into the tool cache) and counts, over the entry's main loop (the
loop holding the most mma instructions: the forward's key loop, the backward's query loop; main_loop):
  mma       tensor-core steps, as m16n8k16 equivalents (sm75's HMMA.1688 counts half)
  ldsm/mma  bytes ldmatrix reads per mma (x4: 512 B, x2: 256 B per warp)
  smem/mma  all shared-memory bytes a warp moves per mma (ldmatrix, loads, stores; not cp.async fills)
  red       global atomic instructions and their width (F32 or the sm90 vector F32x2)
  bar       barrier instructions (BAR.SYNC): per step of the loop, the backward's is FA2's 3
and, from ptxas (-v): registers, spills; from the usual occupancy rules (bench/kernels/kernel_resources.py):
blocks per SM. The counts are static (each instruction once) over one pass of that loop, whose inner
loops are fully unrolled: the steady state, without what runs once per block (the operands a unit keeps
in registers across the loop, FA_Q_IN_REGS's Q and FA_V_IN_REGS's V, are read before it).

dQ atomics (backward): per query block step of fa_bwd a block adds block_m x d floats into dq_accum.
Added straight from the mma fragments one float at a time into a row-major dq_accum, each warp
instruction touches 8 sectors using 16 of their 32 bytes; as sm90 vector pairs, staged through shared
memory (kernels before the permuted layout), or into the permuted dq_accum (bwd.cu dq_index), every
sector is used whole. `dq sect/MFLOP` = sectors per step over
the step's 10 * block_m * block_n * d FLOPs (five GEMMs), per million.

The FA2 rows are FlashAttention-2's own tile choices on each arch run through the same arithmetic
(bench/kernels/fa2_model.py says which facts and how), not its SASS. `--vs-fa2` sets every forward and backward
unit beside them at head dims 64 to 256 on sm 8.0 to 12.0 and marks each measure where ours is worse:
ldmatrix bytes per mma above FA2's, warps per SM below, dQ sectors per MFLOP above, or any spill.

    python bench/kernels/kernel_model.py --vs-fa2 [--record]      # docs/figures.md section kernel-vs-fa2
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "kernels"), str(REPO / "bench")]

import fa2_model  # bench/ is not a package: found through sys.path (bench/kernels/)
import figures
import kernel_resources

from buildtool.builder import toolkits
from buildtool.builder.nvrtc import open_nvrtc, parse_resource_usage
from buildtool.core import cache, fetch
from buildtool.core.cuda_facts import TOOLKITS

# nvdisasm from NVIDIA's PyPI wheel (x86_64 Linux). CUDA 13's nvdisasm reads the cubins of every arch
# fa builds (sm 7.5 and up) and both ELF ABIs.
NVDISASM_PACKAGE = "nvidia-cuda-nvdisasm"
NVDISASM_FILE = "nvidia_cuda_nvdisasm-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
NVDISASM_SHA256 = "53606e719ecae07a2335f95902d5a1393a0cc1c317499ee7ffcf628a44385f2c"
NVDISASM_MEMBER = "nvidia/cu13/bin/nvdisasm"

MAIN_ENTRIES = {"fwd": "fa_fwd", "bwd": "fa_bwd", "splitkv": "fa_fwd_splitkv"}
LDSM_BYTES = {"4": 512, "2": 256, "1": 128}  # per warp instruction


def nvdisasm() -> Path:
    """The pinned nvdisasm, fetched and hash-checked once into the tool cache."""
    root = cache.cache_dir() / "tools" / NVDISASM_FILE.removesuffix(".whl")
    exe = root / "nvdisasm"
    if exe.is_file():
        return exe
    root.mkdir(parents=True, exist_ok=True)
    page_url = f"{fetch.simple_index()}/{NVDISASM_PACKAGE}/"
    page = fetch.read_url(page_url).decode(errors="replace")
    urls = [h.split("#", 1)[0] for h in re.findall(r'href="([^"]+)"', page) if NVDISASM_FILE in h]
    if not urls:
        raise SystemExit(f"kernel_model: {NVDISASM_FILE} is not listed on {page_url}")
    wheel = fetch.download(urls[0], root / NVDISASM_FILE, NVDISASM_SHA256)
    with zipfile.ZipFile(wheel) as zf:
        tmp = root / "nvdisasm.tmp"
        tmp.write_bytes(zf.read(NVDISASM_MEMBER))
    tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR)
    os.replace(tmp, exe)
    wheel.unlink()
    return exe


@dataclass(frozen=True)
class Model:
    """The counts of one unit's main entry on one arch."""

    rev: str  # "tree", or the git revision the sources came from
    unit: str
    tile: str
    arch: str
    entry: str
    head_dim: int
    registers: int
    spills: int  # bytes stored + loaded
    blocks_per_sm: int
    warps_per_sm: int
    mma: float
    ldsm_per_mma: float
    smem_per_mma: float
    red: int
    red_width: int  # floats per atomic instruction (0: none)
    dq_sectors_per_mflop: float  # backward only, else 0
    barriers: int = 0  # BAR.SYNC instructions per pass of the main loop
    cuda: int = 0  # the CUDA major whose NVRTC compiled the SASS (and whose tiles it is: tiles per major)


def opcodes(sass: str, entry: str) -> dict[str, int]:
    """Opcode counts (modifiers kept, predicates dropped) of one function of nvdisasm's output."""
    body = sass.split(f".text.{entry}:", 1)[1].split("//----", 1)[0]
    out: dict[str, int] = {}
    for line in body.splitlines():
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.x]+)", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def disassemble(image: bytes) -> str:
    """nvdisasm's listing of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(image)
        f.flush()
        return subprocess.run(
            [str(nvdisasm()), "-c", f.name], capture_output=True, text=True, check=True
        ).stdout


def main_loop(lines: list[str]) -> list[str]:
    """The steady state of a function: the lines of the loop (a label and a later branch back to it)
    holding the most mma instructions, or every line when no loop holds one. Code before the loop runs
    once per block (e.g. V's fragments read into registers for the whole key block), not per step."""
    labels: dict[str, int] = {}
    best: tuple[int, int, int] = (0, 0, len(lines))
    for i, line in enumerate(lines):
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = i
            continue
        m = re.search(r"\bBRA\b.*\((\.L_x_\d+)\)", line)
        if m and m.group(1) in labels:
            start = labels[m.group(1)]
            mmas = sum("HMMA." in x for x in lines[start : i + 1])
            if mmas > best[0]:
                best = (mmas, start, i + 1)
    return lines[best[1] : best[2]]


def line_weights(loop: list[str], inner_trips: int) -> list[int]:
    """How many times each line of a main loop runs per pass of it: 1, or `inner_trips` for the lines of
    a loop nested in it that holds mma (bwd.cu's dQ passes, FA_DQ_PASSES: a rolled loop whose SASS
    holds one pass of the FA_DQ_PASSES the step runs)."""
    weights = [1] * len(loop)
    if inner_trips <= 1:
        return weights
    labels: dict[str, int] = {}
    for i, line in enumerate(loop[:-1]):
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m and i > 0:
            labels[m.group(1)] = i
            continue
        m = re.search(r"\bBRA\b.*\((\.L_x_\d+)\)", line)
        if m and m.group(1) in labels and any("HMMA." in x for x in loop[labels[m.group(1)] : i + 1]):
            for k in range(labels[m.group(1)], i + 1):
                weights[k] = inner_trips
    return weights


def _sass_counts(sass: str, entry: str, inner_trips: int = 1) -> dict[str, float]:
    """Instruction counts of one function of nvdisasm's output, over its main loop (main_loop), a loop
    nested in it that holds mma counted `inner_trips` times (line_weights)."""
    body = sass.split(f".text.{entry}:", 1)[1].split("//----", 1)[0]
    c = {"mma": 0.0, "ldsm": 0.0, "lds": 0.0, "sts": 0.0, "red": 0.0, "red_width": 0.0, "bar": 0.0}
    loop = main_loop(body.splitlines())
    for line, weight in zip(loop, line_weights(loop, inner_trips), strict=True):
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.x]+)", line)
        if not m:
            continue
        op = m.group(1)
        if op.startswith("BAR.SYNC"):
            c["bar"] += weight
        elif op.startswith("HMMA."):
            c["mma"] += (0.5 if ".1688." in op else 1.0) * weight
        elif op.startswith("LDSM."):
            c["ldsm"] += LDSM_BYTES[op.rsplit(".", 1)[1]] * weight
        elif op.startswith(("LDS", "STS")) and not op.startswith("LDSM"):
            width = re.search(r"\.(32|64|128)\b", op)
            nbytes = 32 * (int(width.group(1)) // 8 if width else 4)  # per warp
            c["lds" if op.startswith("LDS") else "sts"] += nbytes * weight
        elif op.startswith(("RED", "ATOMG", "ATOM.")) and ".ADD.F32" in op:
            c["red"] += weight
            c["red_width"] = 2.0 if "F32x2" in op else 4.0 if "F32x4" in op else 1.0
    return c


def major_units(tiles: ModuleType, arch: str, cuda: int | None) -> list[Any]:
    """tiles.units of `arch` as CUDA `cuda`'s wheels compile them (kernels/tiles.py's tiles per CUDA
    major); a revision's tiles.py from before them has one table for every major."""
    if "cuda" in inspect.signature(tiles.units).parameters:
        return list(tiles.units(arch, cuda))
    return list(tiles.units(arch))


def own_tile_units(tiles: ModuleType, arch: str, cuda: int) -> set[str]:
    """The units of `arch` that CUDA `cuda` compiles with a tile of its own (not the default's)."""
    default = {u.name: u.tile for u in major_units(tiles, arch, None)}
    return {u.name for u in major_units(tiles, arch, cuda) if default.get(u.name) != u.tile}


def model_units(
    tiles: ModuleType,
    csrc: Path,
    rev: str,
    archs: list[str],
    head_dims: list[int],
    cuda: int,
    directions: tuple[str, ...] = tuple(MAIN_ENTRIES),
    only: set[tuple[str, str]] | None = None,
) -> list[Model]:
    """Each unit of `archs` (as CUDA `cuda`'s wheels compile it) in `directions` at `head_dims`, bf16
    (fp16 on 7.5), compiled with that major's NVRTC and counted in its SASS; `only`: these (arch, unit
    name) pairs alone."""
    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(cuda)))
    headers = {p.name: p.read_text() for p in sorted(csrc.iterdir()) if p.suffix in (".h", ".cuh")}
    nvdisasm()  # fetched once, before the first compile
    # From this tree on, dq_accum is permuted (bwd.cu dq_index) so that scalar adds are whole sectors too.
    permuted_dq = "dq_index" in (csrc / "bwd.cu").read_text()
    out = []
    for arch in archs:
        for u in major_units(tiles, arch, cuda):
            entry = MAIN_ENTRIES.get(u.direction)
            if (
                entry is None
                or (only is not None and (arch, u.name) not in only)
                or u.direction not in directions
                or u.head_dim not in head_dims
                or u.dtype != ("fp16" if arch == "7.5" else "bf16")
            ):
                continue
            options = [
                *tiles.nvrtc_options(arch),
                *(f"-D{k}={v}" for k, v in u.defines.items()),
                "-Xptxas=-v",
            ]
            compiled = nvrtc.compile(
                (csrc / Path(u.source).name).read_text(),
                u.source,
                "sm_" + arch.replace(".", ""),
                options,
                headers,
            )
            usage = {r.kernel: r for r in parse_resource_usage(compiled.log)}[entry]
            sass = disassemble(compiled.image)
            c = _sass_counts(sass, entry, u.defines.get("FA_DQ_PASSES", 1))
            launch = u.entries[entry]
            mma = c["mma"] or 1.0
            whole = c["red_width"] >= 2 or u.defines.get("FA_DQ_SMEM", 0) == 1 or permuted_dq
            blocks = kernel_resources.blocks_per_sm(
                arch, launch.threads, usage.registers, launch.smem_bytes + usage.static_smem
            )
            out.append(
                Model(
                    rev=rev,
                    unit=u.name,
                    tile=u.tile,  # tiles.py's own label (BwdTile.label, FwdTile.label)
                    arch=arch,
                    entry=entry,
                    head_dim=u.head_dim,
                    registers=usage.registers,
                    spills=usage.spill_stores + usage.spill_loads,
                    blocks_per_sm=blocks,
                    warps_per_sm=blocks * launch.threads // 32,
                    mma=c["mma"],
                    ldsm_per_mma=round(c["ldsm"] / mma, 1),
                    smem_per_mma=round((c["ldsm"] + c["lds"] + c["sts"]) / mma, 1),
                    red=int(c["red"]),
                    red_width=int(c["red_width"]),
                    dq_sectors_per_mflop=round(
                        fa2_model.dq_sectors_per_mflop(
                            u.defines["FA_BLOCK_M"], u.defines["FA_BLOCK_N"], u.head_dim, whole
                        ),
                        1,
                    )
                    if u.direction == "bwd"
                    else 0.0,
                    barriers=int(c["bar"]),
                    cuda=cuda,
                )
            )
    return out


def _tiles_at(rev: str, dest: Path) -> tuple[ModuleType, Path]:
    """kernels/tiles.py and kernels/csrc of a git revision, unpacked under dest."""
    files = subprocess.run(
        ["git", "-C", str(REPO), "ls-tree", "-r", "--name-only", rev, "kernels/csrc", "kernels/tiles.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        data = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:{name}"], capture_output=True, check=True
        ).stdout
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
    spec = importlib.util.spec_from_file_location(f"_tiles_{rev}", dest / "kernels" / "tiles.py")
    assert spec
    assert spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod, dest / "kernels" / "csrc"


def misses(m: Model, fa2: fa2_model.Fa2Row) -> list[str]:
    """Where one of our units is worse than FA2 by the model: each measure of the issue's bar."""
    out = []
    if m.spills:
        out.append(f"{m.spills} B spilled")
    if m.ldsm_per_mma > fa2.ldsm_per_mma:
        out.append(f"ldsm/mma +{100 * (m.ldsm_per_mma / fa2.ldsm_per_mma - 1):.0f}%")
    if m.warps_per_sm < fa2.warps_per_sm:
        out.append(f"warps/SM {m.warps_per_sm} < {fa2.warps_per_sm}")
    if m.dq_sectors_per_mflop > fa2.dq_sectors_per_mflop:
        out.append(f"dQ sectors x{m.dq_sectors_per_mflop / fa2.dq_sectors_per_mflop:.1f}")
    return out


def _vs_fa2_rows(rows: list[Model]) -> tuple[list[str], int, int]:
    """The table's lines for `rows`, how many are at or better than FA2, and how many have an FA2 row."""
    lines = [
        "| arch | unit | SASS | tile: ours / FA2 | ldsm/mma | warps/SM | dQ sectors/MFLOP | spills | worse than FA2 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    at_or_better = compared = 0
    for m in rows:
        fa2 = fa2_model.row(m.unit.split("_")[0], m.arch, m.head_dim)
        if fa2 is None:
            continue
        compared += 1
        worse = misses(m, fa2)
        at_or_better += not worse
        dq = f"{m.dq_sectors_per_mflop} / {fa2.dq_sectors_per_mflop}" if fa2.dq_sectors_per_mflop else "-"
        lines.append(
            f"| {m.arch} | {m.unit} | cu{m.cuda} | {m.tile} / {fa2.tile} | {m.ldsm_per_mma} / {fa2.ldsm_per_mma} "
            f"| {m.warps_per_sm} / {fa2.warps_per_sm} | {dq} | {m.spills} | {'; '.join(worse) or 'no'} |"
        )
    return lines, at_or_better, compared


def vs_fa2_table(rows: list[Model], apart: list[Model] | None = None) -> str:
    """Markdown: each unit beside FA2's tile on its arch, and where it is worse; `apart`: the units a
    CUDA major compiles with tiles of its own (tiles per CUDA major), in a table of their own."""
    lines, at_or_better, compared = _vs_fa2_rows(rows)
    majors = sorted({m.cuda for m in rows})
    lines.append("")
    lines.append(
        f"{at_or_better} of {compared} units at or better than FA2 on every measure (ldmatrix bytes per mma at or"
        " below, warps per SM at or above, backward dQ sectors per MFLOP at or below, no spill). Ours: the SASS"
        f" of the bf16 units as the {', '.join(f'cu{c}' for c in majors)} wheels ship them (column SASS: the CUDA"
        " major whose NVRTC compiled the cubin, with that major's tiles from kernels/tiles.py; the cu13 wheels"
        " ship CUDA 12's cubins for these archs, cuda_facts.SASS_FROM); FA2: its own tile choices through the"
        " same arithmetic, registers assumed at 255 (bench/kernels/fa2_model.py). Not verified on a GPU."
    )
    if apart:
        own, better, total = _vs_fa2_rows(apart)
        lines += ["", *own, ""]
        lines.append(
            f"Apart, not counted above: the units whose tile is CUDA {', '.join(sorted({str(m.cuda) for m in apart}))}'s"
            " own, where its NVRTC spills on the tile above (kernels/tiles.py ArchFamily.per_cuda), as the"
            f" cu{apart[0].cuda} wheels ship them: {better} of {total} at or better than FA2."
        )
    return "\n".join(lines)


# ---- sm_90a: warpgroup MMAs (hopper_fwd.cu) beside FlashAttention-3 --------------------------------

# FlashAttention-3's sm90 forward tiles for 16-bit inputs with head_dim_v = head_dim (hopper/tile_size.h,
# tile_size_fwd_sm90 -> {kBlockM, kBlockN, MmaPV_is_RS, IntraWGOverlap}), non-causal and causal; and its
# register split (hopper/flash_fwd_kernel_sm90.h: producer / consumer setmaxnreg by consumer warpgroups).
FA3_FWD_SM90: dict[int, dict[str, tuple[int, int, bool, bool]]] = {
    64: {"non-causal": (192, 192, False, True), "causal": (192, 128, True, True)},
    96: {"non-causal": (192, 144, False, True), "causal": (192, 144, False, True)},
    128: {"non-causal": (128, 176, True, True), "causal": (128, 128, True, True)},
    192: {"non-causal": (128, 112, True, True), "causal": (128, 112, True, True)},
    256: {"non-causal": (128, 80, True, True), "causal": (128, 80, True, True)},
}
FA3_STAGES = 2
WG_REGS = {1: (56, 256), 2: (24, 240), 3: (32, 160)}  # consumer warpgroups -> (producer, consumer) registers


@dataclass(frozen=True)
class WgmmaModel:
    """The warpgroup-MMA arithmetic of one sm_90a forward tile, per key block of one block (K/V stage)."""

    who: str  # "ours" (with SASS) or "FA3 <case>"
    head_dim: int
    tile: str
    consumers: int
    pv_from_registers: bool
    hgmma: int  # per consumer warpgroup per key block (ours: counted in the SASS)
    smem_per_hgmma: float  # shared-memory operand bytes an HGMMA reads, on average
    smem_per_kflop: float  # shared-memory bytes (operands, and P's round trip when P V is SS) per 1000 FLOPs
    tma_kv_bytes: int  # K and V of one key block
    tma_q_bytes: int  # Q, once per block
    regs: str  # registers per thread after reallocation: producer / consumer
    acc_regs: int  # fp32 accumulators + P's packed registers per consumer thread (S, O, P)
    mbarrier_ops: int  # per key block: consumer waits and arrivals of one thread, producer waits and arms
    named_barriers: int  # per key block per consumer warpgroup: the ping-pong's sync and arrive
    smem_bytes: int
    ptxas_regs: int = 0  # the launch's registers (ours)
    spills: int = 0


def wgmma_model(who: str, d: int, block_m: int, block_n: int, stages: int, pv_rs: bool, hgmma_seen: int = 0,
                ptxas_regs: int = 0, spills: int = 0, smem_bytes: int | None = None) -> WgmmaModel:  # fmt: skip
    """S = Q K^T as d / 16 HGMMAs m64 n(block_n) k16, both operands from shared memory (A 64 x 16, B block_n
    x 16: 2048 + 32 block_n bytes each); O += P V as block_n / 16 HGMMAs m64 n(d) k16, B 16 x d (32 d bytes)
    and A = P from registers, or, when P V is SS (FA3's choice at some head dims), 2048 more bytes each after
    P's 64 x block_n tile is stored to shared memory. `smem_bytes`: the unit's own figure (tiles.py's, which
    counts its every mbarrier) in place of the estimate FA3's rows get."""
    wgs = block_m // 64
    s_steps, pv_steps = d // 16, block_n // 16
    s_bytes = s_steps * (2048 + 32 * block_n)
    pv_bytes = pv_steps * (32 * d + (0 if pv_rs else 2048))
    p_store = 0 if pv_rs else 64 * block_n * 2
    flops = 2 * 64 * block_n * d * 2  # both GEMMs of one warpgroup's 64 rows
    producer, consumer = WG_REGS[wgs]
    acc = block_n // 2 + d // 2 + (block_n // 4 if pv_rs else 0)
    # Q, the K and V rings, the mbarriers; SS P V also stages P (block_m x block_n) in shared memory
    smem = smem_bytes or (
        (block_m + 2 * stages * block_n) * d * 2
        + 8 * (1 + 4 * stages)
        + (0 if pv_rs else block_m * block_n * 2)
    )
    return WgmmaModel(
        who=who,
        head_dim=d,
        tile=f"{block_m}x{block_n}",
        consumers=wgs,
        pv_from_registers=pv_rs,
        hgmma=hgmma_seen or s_steps + pv_steps,
        smem_per_hgmma=round((s_bytes + pv_bytes) / (s_steps + pv_steps), 1),
        smem_per_kflop=round(1000 * (s_bytes + pv_bytes + p_store) / flops, 2),
        tma_kv_bytes=2 * block_n * d * 2,
        tma_q_bytes=block_m * d * 2,
        regs=f"{producer} / {consumer}",
        acc_regs=acc,
        mbarrier_ops=2 + 2 + 2 + 2,  # consumer: wait K, V full, arrive K, V empty; producer: wait, arm each
        named_barriers=2,
        smem_bytes=smem,
        ptxas_regs=ptxas_regs,
        spills=spills,
    )


def model_sm90a(tiles: ModuleType, csrc: Path, cuda: int) -> list[WgmmaModel]:
    """Each bf16 sm_90a unit compiled (NVRTC of `cuda`), its HGMMAs counted in the SASS, beside FA3's tiles."""
    nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(cuda)))
    headers = {p.name: p.read_text() for p in sorted(csrc.iterdir()) if p.suffix in (".h", ".cuh")}
    nvdisasm()
    out = []
    for u in (u for u in tiles.units("9.0a") if u.dtype == "bf16"):
        (entry,) = u.entries
        options = [*tiles.nvrtc_options("9.0a"), *(f"-D{k}={v}" for k, v in u.defines.items()), "-Xptxas=-v"]
        compiled = nvrtc.compile(
            (csrc / Path(u.source).name).read_text(), u.source, "sm_90a", options, headers
        )
        usage = {r.kernel: r for r in parse_resource_usage(compiled.log)}[entry]
        ops = opcodes(disassemble(compiled.image), entry)
        # the loop body holds each GEMM once; with two consumers (the intra-warpgroup overlap) the loop's
        # prologue and epilogue hold a second copy of S's and P V's HGMMAs
        places = 2 if u.defines["FA_CONSUMER_WGS"] == 2 else 1
        seen = sum(c for op, c in ops.items() if op.startswith("HGMMA")) // places
        d, bm, bn = u.head_dim, u.defines["FA_BLOCK_M"], u.defines["FA_BLOCK_N"]
        out.append(
            wgmma_model(
                "ours",
                d,
                bm,
                bn,
                u.defines["FA_STAGES"],
                True,
                seen,
                usage.registers,
                usage.spill_stores + usage.spill_loads,
                u.defines["FA_SMEM_BYTES"],
            )
        )
        for case, (fm, fn, rs, _overlap) in FA3_FWD_SM90[d].items():
            if case == "causal" and FA3_FWD_SM90[d]["non-causal"] == (fm, fn, rs, _overlap):
                continue
            out.append(wgmma_model(f"FA3 {case}", d, fm, fn, FA3_STAGES, rs))
    return out


def sm90a_table(rows: list[WgmmaModel]) -> str:
    head = (
        "| d | who | tile (M x N) | WGs | P V | HGMMA / K-V block | smem B / HGMMA | smem B / kFLOP | TMA K+V B / block"
        " | TMA Q B | regs prod / cons | S+O+P regs | mbarrier ops / block | named bar. / block | smem B | spills |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in rows:
        lines.append(
            f"| {m.head_dim} | {m.who} | {m.tile} | {m.consumers} | {'RS' if m.pv_from_registers else 'SS'} "
            f"| {m.hgmma} | {m.smem_per_hgmma} | {m.smem_per_kflop} | {m.tma_kv_bytes} | {m.tma_q_bytes} "
            f"| {m.regs}{f' (ptxas {m.ptxas_regs})' if m.ptxas_regs else ''} | {m.acc_regs} | {m.mbarrier_ops} | {m.named_barriers} | {m.smem_bytes} "
            f"| {m.spills if m.who == 'ours' else '-'} |"
        )
    lines.append("")
    lines.append(
        "Per key block (one K/V pipeline stage) of one consumer warpgroup (64 query rows). Ours: the bf16 units of"
        " tiles.py's 9.0a table, HGMMAs counted in the SASS (NVRTC of the stamp's CUDA major, nvdisasm), ptxas's"
        " spills; FA3: its hopper/tile_size.h choices (non-causal, and causal where they differ) through the same"
        " arithmetic. smem B / kFLOP counts wgmma's shared-memory operand reads, plus P's store and reads when"
        " P V takes P from shared memory (SS). Registers are the setmaxnreg split; S+O+P is the accumulator"
        " floor of a consumer thread. Not verified on a GPU."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", action="append", help="arch like 9.0 (repeatable; default 8.0, 8.6, 9.0)")
    ap.add_argument("--head-dim", type=int, action="append", help="head-dim buckets (default 64, 128, 256)")
    ap.add_argument("--cuda", type=int, default=12, choices=(11, 12, 13), help="the NVRTC to compile with")
    ap.add_argument("--before", metavar="REV", help="also model the kernels of this git revision")
    ap.add_argument(
        "--json", type=Path, help="write the rows here (default: the user's cache, bench/kernel_model.json)"
    )
    ap.add_argument(
        "--vs-fa2",
        action="store_true",
        help="forward and backward beside FA2 (default archs 8.0 8.6 8.9 9.0 10.0 12.0, head dims 64-256)",
    )
    ap.add_argument(
        "--sm90a",
        action="store_true",
        help="the sm_90a forward's warpgroup-MMA model beside FlashAttention-3's tiles",
    )
    ap.add_argument(
        "--record",
        action="store_true",
        help="with --vs-fa2 or --sm90a: write docs/figures.md kernel-vs-fa2 or kernel-sm90a",
    )
    args = ap.parse_args(argv)
    if args.record and not (args.vs_fa2 or args.sm90a):
        ap.error("--record writes the --vs-fa2 or --sm90a table: give one of them too")
    if args.sm90a:
        sys.path.insert(0, str(REPO / "kernels"))
        import tiles as tiles_now

        rows_90a = model_sm90a(tiles_now, REPO / "kernels" / "csrc", args.cuda)
        figures.report("kernel-sm90a", sm90a_table(rows_90a), args.record)
        return 0
    if args.vs_fa2:
        archs = args.arch or ["8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]
        head_dims = args.head_dim or [64, 96, 128, 192, 256]
        directions: tuple[str, ...] = ("fwd", "bwd")
    else:
        archs = args.arch or ["8.0", "8.6", "9.0"]
        head_dims = args.head_dim or [64, 128, 256]
        directions = tuple(MAIN_ENTRIES)

    sys.path.insert(0, str(REPO / "kernels"))
    import tiles

    rows = model_units(tiles, REPO / "kernels" / "csrc", "tree", archs, head_dims, args.cuda, directions)
    before: list[Model] = []
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            old_tiles, old_csrc = _tiles_at(args.before, Path(tmp))
            before = model_units(old_tiles, old_csrc, args.before, archs, head_dims, args.cuda, directions)

    out = args.json or figures.cache_out("kernel_model.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(m) for m in before + rows], indent=1) + "\n")
    if args.vs_fa2:
        apart: list[Model] = []
        if args.cuda != 11:  # the cu11 wheels' own tiles, compiled by NVRTC 11.8 (it targets up to 9.0)
            only = {
                (a, name)
                for a in archs
                if a in TOOLKITS[11].archs
                for name in own_tile_units(tiles, a, 11)
                if name.split("_")[0] in directions and int(name.rsplit("_d", 1)[1]) in head_dims
            }
            if only:
                apart = model_units(
                    tiles, REPO / "kernels" / "csrc", "tree", archs, head_dims, 11, directions, only
                )
        body = vs_fa2_table(rows, apart)
        if before:
            body = f"Before ({args.before}):\n\n{vs_fa2_table(before)}\n\nAfter (this tree):\n\n{body}"
        figures.report("kernel-vs-fa2", body, args.record)
        print(f"wrote {out}")
        return 0

    key = {(m.arch, m.unit): m for m in before}
    head = (
        f"{'arch':>4} {'unit':<18} {'':<7} {'tile':<14} {'regs':>4} {'spill':>5} {'warp/SM':>7} {'mma':>5} "
        f"{'ldsm/mma':>8} {'smem/mma':>8} {'red':>4} {'x':>1} {'dq sect/MFLOP':>13} {'bar':>3}"
    )
    print(head)
    print("-" * len(head))

    def line(m: Model, who: str) -> str:
        red = f"{m.red:>4} {m.red_width:>1}" if m.red else f"{'-':>4} {'':>1}"
        dq = f"{m.dq_sectors_per_mflop:>13}" if m.dq_sectors_per_mflop else f"{'-':>13}"
        return (
            f"{m.arch:>4} {m.unit:<18} {who:<7} {m.tile:<14} {m.registers:>4} {m.spills:>5} {m.warps_per_sm:>7} "
            f"{m.mma:>5.0f} {m.ldsm_per_mma:>8} {m.smem_per_mma:>8} {red} {dq} {m.barriers:>3}"
        )

    for m in rows:
        old = key.get((m.arch, m.unit))
        if old:
            print(line(old, "before"))
        print(line(m, "after"))
        fa2 = fa2_model.row(m.unit.split("_")[0], m.arch, m.head_dim) if m.entry != "fa_fwd_splitkv" else None
        if fa2:
            dq = fa2.dq_sectors_per_mflop or "-"
            print(
                f"{m.arch:>4} {m.unit:<18} {'FA2':<7} {fa2.tile:<14} {'':>4} {'':>5} {fa2.warps_per_sm:>7} "
                f"{'':>5} {fa2.ldsm_per_mma:>8} {'':>8} {'':>4} {'':>1} {dq:>13}"
            )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
