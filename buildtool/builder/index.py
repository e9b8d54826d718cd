"""wheels/index.json (docs/contracts.md section 5) and a PEP 503 simple index, made from the wheels.

Everything is read back from the wheel files themselves (their names, bytes and fa_attn/manifest.json),
never from the build that wrote them, so the wheels of several shards merge by re-indexing the
directory they were copied into (`fa index wheels/`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from buildtool.builder import out_files
from buildtool.core.runtime import schema
from buildtool.core.wheel_file import wheel_entry


def _env() -> jinja2.Environment:
    loader = jinja2.FileSystemLoader(Path(__file__).parent / "templates")
    return jinja2.Environment(loader=loader, autoescape=True, keep_trailing_newline=True)


def write_index(wheel_dir: Path, *, take_over: bool = False) -> dict[str, Any]:
    """(Re)write wheel_dir/index.json and wheel_dir/simple/ from the *.whl files there: every one,
    whoever wrote it (other platforms' wheels copied in are merged), except that a wheel fa wrote
    must still have the sha256 it wrote. The index files are replaced only if fa wrote them, unless
    `take_over` (`fa index DIR`, asked to rewrite them); nothing is written through a link."""
    wheels = sorted(wheel_dir.glob("fa_attn-*.whl"))  # temporaries are named *.whl.fa-tmp-*: not matched
    entries = []
    for path in wheels:
        out_files.inside(wheel_dir, path.name)  # a linked wheel is not followed
        entry = wheel_entry(path)
        out_files.check_kept(wheel_dir, path.name, entry.sha256)
        entries.append(entry)
    index = schema.index_json(entries)
    out_files.write_json(wheel_dir, "index.json", index, take_over=take_over)
    env = _env()
    root_page = env.get_template("root.html.j2").render(projects=[schema.PACKAGE])
    out_files.write_text(wheel_dir, "simple/index.html", root_page, take_over=take_over)
    page = env.get_template("project.html.j2").render(
        project=schema.PACKAGE, wheels=index["wheels"] + index["all_wheels"], prefix="../../"
    )
    out_files.write_text(wheel_dir, f"simple/{schema.PACKAGE}/index.html", page, take_over=take_over)
    return index
