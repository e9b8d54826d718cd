"""wheels/index.html: the index as a page people use. Pick a machine, get the line that installs the
wheel `fa doctor` would pick for it, and below, a sortable table of every wheel.

One static file with its data, style and script inline: no network request, no CDN, so it works from
file:// and from any static host. The answers are computed here, at index time, by the same choose
code `fa doctor` runs (compat/picker.py), and embedded as JSON; the page's script only looks them up.
This is the one place the build pipeline asks compat: the index it writes answers with compat's choice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

from buildtool.builder import out_files
from buildtool.compat import picker
from buildtool.core.console import size_text
from buildtool.core.runtime import schema

PAGE = "index.html"


def _env() -> jinja2.Environment:
    loader = jinja2.FileSystemLoader(Path(__file__).parent / "templates")
    return jinja2.Environment(loader=loader, autoescape=True, keep_trailing_newline=True)


def _script_json(data: Any) -> str:
    """JSON safe inside <script type="application/json">: no "</script>" or "<!--" can appear in it."""
    text = json.dumps(data, separators=(",", ":"), sort_keys=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _versions(minors: Sequence[str]) -> list[str]:
    return sorted(set(minors), key=lambda m: tuple(int(p) for p in m.split(".")))


def torch_range(info: schema.WheelInfo) -> str:
    """The torch a wheel serves, as its binding says: one minor (and its C++ ABI where the variant names
    it), a stable-ABI floor and the minors it was tested with, or the all-wheel's span."""
    if info.universal:
        return "any (no binding: calls run on torch SDPA)"
    if info.all_wheel:
        minors = _versions([m for b in info.bindings for m in (b.torch, *b.torch_tested)])
        return f"{minors[0]} to {minors[-1]}, every binding" if minors else ""
    if info.binding_form == "stable":
        tested = _versions(info.torch_tested)
        return (
            f"{info.torch} and newer (tested {tested[0]} to {tested[-1]})" if tested else f">= {info.torch}"
        )
    abi = f", C++ ABI {str(info.cxx11abi).lower()}" if "cxx11abi" in info.variant else ""
    return f"{info.torch}{abi}"


def cuda_cell(info: schema.WheelInfo) -> str:
    """Each CUDA major with the driver its SASS needs."""
    if info.kernel_sets:
        return ", ".join(f"{k.cuda_major} (driver >= {k.min_driver})" for k in info.kernel_sets)
    return f"{info.cuda_major} (driver >= {info.min_driver})" if info.cuda_major is not None else "none"


def _archs(info: schema.WheelInfo) -> tuple[str, str]:
    if info.kernel_sets:
        sass = "; ".join(f"{k.cuda_major}: {' '.join(k.sass)}" for k in info.kernel_sets)
        ptx = "; ".join(f"{k.cuda_major}: {k.ptx}" for k in info.kernel_sets if k.ptx) or "none"
        return sass, ptx
    return " ".join(info.sass) or "none", info.ptx or "none"


def wheel_rows(entries: Sequence[schema.IndexEntry]) -> list[dict[str, Any]]:
    """The table of every wheel: what each serves, read from its index entry."""
    rows = []
    for entry in entries:
        info = entry.info
        sass, ptx = _archs(info)
        rows.append(
            {
                "file": entry.file,
                "variant": "universal" if info.universal else info.variant,
                "cpu": info.platform or "any",
                "torch": torch_range(info),
                "cuda": cuda_cell(info),
                "sass": sass,
                "ptx": ptx,
                "size": entry.size or 0,
                "size_text": size_text(entry.size),
                "sha256": entry.sha256,
            }
        )
    return rows


def render(entries: Sequence[schema.IndexEntry]) -> str:
    """The page for these index entries."""
    data = picker.page_data(entries)
    return (
        _env()
        .get_template("index_page.html.j2")
        .render(
            data_json=_script_json(data),
            rows=wheel_rows(entries),
            package=schema.PACKAGE,
            tell=picker.TELL,
            assumes=data["assumes"],
            options=data["options"],
        )
    )


def is_ours(path: Path) -> bool:
    """Whether fa may write the page at `path`: absent, or as fa wrote it (out_files' record)."""
    return out_files.own(path.parent, path.name)


def write_page(wheel_dir: Path, entries: Sequence[schema.IndexEntry]) -> Path | None:
    """(Re)write wheel_dir/index.html; None, touching nothing, when an index.html fa did not write is
    there (a landing page of the user's own)."""
    if not is_ours(wheel_dir / PAGE):
        return None
    return out_files.write_text(wheel_dir, PAGE, render(entries))
