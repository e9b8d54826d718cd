"""fa build's summary at 80 columns: a row per wheel named by its variant and CPU, nothing cut off."""

from __future__ import annotations

from rich.console import Console

from buildtool.builder.pipeline import BuildSummary, WheelReport, summary_table


def report(variant: str, platform: str | None, file: str) -> WheelReport:
    return WheelReport(file, variant, platform, 3_400_000, "manylinux_2_28_x86_64", "", 6, 1234.5, 206, 207)


def test_the_summary_fits_80_columns() -> None:
    summary = BuildSummary(
        out_dir="wheels",
        wheels=[
            report("cu12torch2.5cxx11abifalse", "x86_64", "fa_attn-0.1.0+cu12torch2.5cxx11abifalse-py3-none-manylinux_2_28_x86_64.whl"),
            report("cu13torch2.13", "aarch64", "fa_attn-0.1.0+cu13torch2.13-py3-none-manylinux_2_28_aarch64.whl"),
            report("", None, "fa_attn-0.1.0-py3-none-any.whl"),
        ],
    )  # fmt: skip
    console = Console(record=True, width=80)
    console.print(summary_table(summary))
    lines = console.export_text().splitlines()
    rows = [line.split() for line in lines]
    assert ["cu12torch2.5cxx11abifalse", "x86_64", "3.2", "MiB", "6", "1234.5", "206", "207"] in rows
    assert ["universal", "any", "3.2", "MiB", "6", "1234.5", "206", "207"] in rows
    assert not any("…" in line or ".whl" in line for line in lines)
    assert summary.to_json()["wheels"][0]["file"].endswith(".whl")  # --json keeps the file names
