"""wheels/index.json (docs/contracts.md section 5) and a PEP 503 simple index, made from the wheels,
and wheels/index.html, the page that answers which wheel a machine takes (index_page.py).

Everything is read back from the wheel files themselves (their names, bytes and fa_attn/manifest.json),
never from the build that wrote them, so the wheels of several shards merge by re-indexing the
directory they were copied into (`fa index wheels/`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from buildtool.builder import index_page
from buildtool.core import atomic
from buildtool.core.runtime import schema
from buildtool.core.wheel_file import wheel_entry


def _env() -> jinja2.Environment:
    loader = jinja2.FileSystemLoader(Path(__file__).parent / "templates")
    return jinja2.Environment(loader=loader, autoescape=True, keep_trailing_newline=True)


def write_index(wheel_dir: Path) -> dict[str, Any]:
    """(Re)write wheel_dir/index.json and wheel_dir/simple/ from the *.whl files there."""
    wheels = sorted(wheel_dir.glob("fa_attn-*.whl"))  # temporaries are named *.whl.fa-tmp-*: not matched
    entries = [wheel_entry(p) for p in wheels]
    index = schema.index_json(entries)
    atomic.write_json(wheel_dir / "index.json", index)
    env = _env()
    simple = wheel_dir / "simple"
    atomic.write_text(
        simple / "index.html", env.get_template("root.html.j2").render(projects=[schema.PACKAGE])
    )
    page = env.get_template("project.html.j2").render(
        project=schema.PACKAGE, wheels=index["wheels"] + index["all_wheels"], prefix="../../"
    )
    atomic.write_text(simple / schema.PACKAGE / "index.html", page)
    index_page.write_page(wheel_dir, schema.read_index(index))
    return index
