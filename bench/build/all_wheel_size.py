"""The all-wheel's size and composition, and what the images it leaves out would weigh.

    python bench/build/all_wheel_size.py --wheels DIR [--cpu x86_64|aarch64] [--json OUT] [--record]

DIR is `fa build --matrix matrix.yaml --platform CPU`'s output (the all-wheel and the per-variant
wheels beside it). Reports, from the wheel files themselves:
- the all-wheel: bytes on disk (what PyPI's 100 MB default limit and the 40 MB target count), and per
  part (runtime, each binding, each CUDA major's SASS per arch and PTX) bytes compressed / unpacked;
- CUDA 13 against CUDA 12 for the same (arch, unit), from the cu13 and cu12 stable-ABI wheels: how many
  cubins are byte-identical, and how their code (.text sections, read with pyelftools) and sizes
  differ (byte-equal .text: the same machine code); this is what decides whether CUDA 13's cubins go in (no GPU here to time them);
- what the left-out images would add: CUDA 13's cubins for archs CUDA 12 ships, CUDA 11's PTX;
- every wheel's size on disk, the per-variant ones as a range per CUDA major.
`--record` writes the sizes into docs/figures.md (section wheel-sizes), the one place docs quote them
from, in MiB (1 MiB = 1,048,576 bytes, the unit fa prints).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from buildtool.core.runtime import schema

MIB = 1024 * 1024


def manifest(zf: zipfile.ZipFile) -> schema.Manifest:
    return schema.Manifest.from_json(json.loads(zf.read(schema.MANIFEST_PATH)))


def wheels_by_variant(folder: Path, cpu: str) -> dict[str, Path]:
    """The wheels of one CPU in `folder`, by variant."""
    out = {}
    for whl in sorted(folder.glob(f"fa_attn-*_{cpu}.whl")):
        with zipfile.ZipFile(whl) as zf:
            out[manifest(zf).info.variant or "universal"] = whl
    return out


def composition(whl: Path) -> dict[str, Any]:
    """Bytes per part of the all-wheel: compressed (in the zip) and unpacked."""
    parts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # compressed, unpacked, files
    with zipfile.ZipFile(whl) as zf:
        for item in zf.infolist():
            name = item.filename.removeprefix(f"{schema.DIST}/")
            if name.startswith("kernels/cu"):
                major, image_dir = name.split("/")[1:3]
                part = f"{major} {image_dir}"
            elif name.startswith("bindings/"):
                part = "binding " + name.split("-", 1)[1].removesuffix(".so")
            elif name == "manifest.json":
                part = "manifest.json"
            else:
                part = "runtime and metadata"
            parts[part][0] += item.compress_size
            parts[part][1] += item.file_size
            parts[part][2] += 1
    return {k: {"compressed": v[0], "unpacked": v[1], "files": v[2]} for k, v in sorted(parts.items())}


def code(cubin: bytes) -> bytes:
    """The machine code: the cubin's .text.* sections, in order (headers, notes and symbols aside)."""
    elf = ELFFile(io.BytesIO(cubin))
    return b"".join(s.data() for s in elf.iter_sections() if s.name.startswith(".text"))


def compare_majors(newer: Path, older: Path) -> dict[str, Any]:
    """CUDA 13's cubins against CUDA 12's for every (arch, unit) both wheels ship as SASS."""
    with zipfile.ZipFile(newer) as zn, zipfile.ZipFile(older) as zo:
        new_files = {(k.arch, k.unit): k.file for k in manifest(zn).kernels if k.image == "sass"}
        old_files = {(k.arch, k.unit): k.file for k in manifest(zo).kernels if k.image == "sass"}
        per_arch: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for key in sorted(new_files.keys() & old_files.keys()):
            new = zn.read(f"{schema.DIST}/{new_files[key]}")
            old = zo.read(f"{schema.DIST}/{old_files[key]}")
            row = per_arch[key[0]]
            row["cubins"] += 1
            row["identical"] += new == old
            row["same_code"] += code(new) == code(old)
            row["bytes_13"] += len(new)
            row["bytes_12"] += len(old)
            row["text_13"] += len(code(new))
            row["text_12"] += len(code(old))
            row["compressed_13"] += zn.getinfo(f"{schema.DIST}/{new_files[key]}").compress_size
    return {arch: dict(row) for arch, row in per_arch.items()}


def image_bytes(whl: Path, image: str) -> int:
    """Compressed bytes of one image kind (sass or ptx) in a per-variant wheel."""
    with zipfile.ZipFile(whl) as zf:
        files = {f"{schema.DIST}/{k.file}" for k in manifest(zf).kernels if k.image == image}
        return sum(zf.getinfo(name).compress_size for name in files)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", type=Path, required=True)
    ap.add_argument("--cpu", default="x86_64", help="the CPU whose wheels to read (x86_64, aarch64)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--record", action="store_true", help="write the sizes into docs/figures.md")
    args = ap.parse_args()
    wheels = wheels_by_variant(args.wheels, args.cpu)
    if "all" not in wheels:
        print(f"error: --wheels {args.wheels}: no all-wheel (variant all)", file=sys.stderr)
        print("  fix: build with matrix.yaml's all_wheel: true", file=sys.stderr)
        return 2
    whole = wheels["all"]
    figures: dict[str, Any] = {"all_wheel": whole.name, "bytes": whole.stat().st_size}
    figures["parts"] = composition(whole)
    print(f"{whole.name}: {figures['bytes'] / MIB:.2f} MiB ({figures['bytes']} bytes)")
    print(f"{'part':32} {'compressed':>12} {'unpacked':>12} {'files':>6}")
    for part, row in figures["parts"].items():
        print(f"{part:32} {row['compressed']:>12,} {row['unpacked']:>12,} {row['files']:>6}")
    cu13 = next((w for v, w in wheels.items() if v.startswith("cu13") and v.endswith("plus")), None)
    cu12 = next((w for v, w in wheels.items() if v.startswith("cu12") and v.endswith("plus")), None)
    if cu13 and cu12:
        figures["cu13_vs_cu12"] = compare_majors(cu13, cu12)
        figures["cu13_sass_compressed"] = image_bytes(cu13, "sass")
        print("\nCUDA 13 cubins against CUDA 12's, same arch and unit:")
        print(f"{'arch':>5} {'cubins':>6} {'identical':>9} {'same code':>9} {'text 12':>10} {'text 13':>10}")
        for arch, row in figures["cu13_vs_cu12"].items():
            print(
                f"{arch:>5} {row['cubins']:>6} {row['identical']:>9} {row['same_code']:>9} "
                f"{row['text_12']:>10,} {row['text_13']:>10,}"
            )
        print(f"CUDA 13's SASS would add {figures['cu13_sass_compressed'] / MIB:.2f} MiB compressed")
    cu11 = next((w for v, w in wheels.items() if v.startswith("cu11")), None)
    if cu11:
        figures["cu11_ptx_compressed"] = image_bytes(cu11, "ptx")
        print(f"CUDA 11's PTX would add {figures['cu11_ptx_compressed'] / MIB:.2f} MiB compressed")
    figures["wheels"] = {variant: whl.stat().st_size for variant, whl in wheels.items()}
    universal = sorted(args.wheels.glob("fa_attn-*-py3-none-any.whl"))
    if universal:
        figures["wheels"]["universal"] = universal[0].stat().st_size
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    if args.record:
        sys.path.insert(0, str(REPO / "bench"))  # bench/figures.py, one folder up from this script
        from figures import record

        record("wheel-sizes", sizes_table(figures, args.cpu))
    return 0


def mib(n: int) -> str:
    return f"{n / MIB:.2f} MiB"


def span(sizes: list[int]) -> str:
    """The smallest to the largest in MiB, or one figure when they round alike ("0.07 to 0.07" read odd)."""
    low, high = mib(min(sizes)), mib(max(sizes))
    return low if low == high else f"{min(sizes) / MIB:.2f} to {high}"


def arch_name(folder: str) -> str:
    """A kernel folder's arch as docs write it: "86" -> "8.6", "100" -> "10.0", and the arch-specific
    "90a" (Hopper's sm_90a forward) -> "9.0a"."""
    digits = folder.rstrip("abcdefghijklmnopqrstuvwxyz")
    return f"{digits[:-1]}.{digits[-1]}{folder[len(digits) :]}"


def arch_key(arch: str) -> tuple[int, int, str]:
    """Numeric order, an arch-specific target right after its arch ("9.0", "9.0a", "10.0")."""
    major, minor = arch.split(".")
    return int(major), int(minor.rstrip("abcdefghijklmnopqrstuvwxyz")), minor


def sizes_table(figures: dict[str, Any], cpu: str) -> str:
    """The wheels' sizes and the all-wheel's parts, in MiB, as docs quote them."""
    parts = figures["parts"]
    bindings = {k: v for k, v in parts.items() if k.startswith("binding ")}
    rows = [
        "| wheel or part | size (compressed) | note |",
        "| --- | --- | --- |",
        f"| the all-wheel, {cpu} | {mib(figures['bytes'])} | {sum(v['files'] for v in parts.values())} files |",
    ]
    majors = sorted({v.split("torch", 1)[0] for v in figures["wheels"] if v.startswith("cu")})
    for major in majors:
        sizes = [n for v, n in figures["wheels"].items() if v.startswith(f"{major}torch")]
        rows.append(f"| per-variant {major} wheels | {span(sizes)} | {len(sizes)} wheels |")
    if "universal" in figures["wheels"]:
        rows.append(
            f"| the universal wheel (py3-none-any) | {mib(figures['wheels']['universal'])} | no kernels |"
        )
    each = [v["compressed"] for v in bindings.values()]
    rows.append(f"| all-wheel: {len(bindings)} bindings | {mib(sum(each))} | {span(each)} each |")
    for major in sorted({k.split()[0] for k in parts if k.startswith("cu")}):
        for image, prefix in (("SASS", "sm_"), ("PTX", "compute_")):
            mine = {k.split()[1]: v for k, v in parts.items() if k.startswith(f"{major} {prefix}")}
            if mine:
                archs = " ".join(sorted((arch_name(a.removeprefix(prefix)) for a in mine), key=arch_key))
                total = sum(v["compressed"] for v in mine.values())
                # Named by folder: a kernel set also runs an older major's identical cubins, stored once
                # in that major's folder (docs/build.md), so kernels/cu12/ is not all of CUDA 12's SASS.
                rows.append(f"| all-wheel: kernels/{major}/ {image} ({archs}) | {mib(total)} | kept |")
    differs = any(r["same_code"] < r["cubins"] for r in figures.get("cu13_vs_cu12", {}).values())
    if differs:  # where CUDA 13's code is CUDA 12's, the cu13 wheels carry CUDA 12's cubins: nothing to add
        rows.append(
            f"| CUDA 13's own SASS | +{mib(figures['cu13_sass_compressed'])} | left out (docs/build.md) |"
        )
    if "cu11_ptx_compressed" in figures:
        rows.append(f"| CUDA 11's PTX | +{mib(figures['cu11_ptx_compressed'])} | left out (docs/build.md) |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
