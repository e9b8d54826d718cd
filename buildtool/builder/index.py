"""wheels/index.json (docs/contracts.md section 5) and the PEP 503 indexes, made from the wheels,
and wheels/index.html, the page that answers which wheel a machine takes (index_page.py).

Everything is read back from the wheel files themselves (their names, bytes and fa_attn/manifest.json),
never from the build that wrote them, so the wheels of several shards merge by re-indexing the
directory they were copied into (`fa index wheels/`).

PEP 503 indexes, one per variant (buildtool/core/install_lines.py names them): `wheels/cu12/simple/`,
`wheels/cu12-torch2.9/simple/`, ... each holding its variant's wheels plus the all-wheels and the
universal wheel, and the root `wheels/simple/` holding only those two kinds. Every fa-attn wheel has
the same `py3-none-<platform>` tags, so an index listing every variant would give pip and uv the
highest local label whatever torch is installed. The pages link to the wheels in `wheels/` by
relative URL, so the tree works over HTTP and file:// alike, with no copies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from buildtool.builder import index_page
from buildtool.core import atomic, install_lines
from buildtool.core.runtime import schema
from buildtool.core.wheel_file import wheel_entry

# In every project page fa writes: how `fa index` tells its own stale variant pages (a variant whose
# wheels are gone) from anything else under wheels/, which it never touches.
GENERATOR = "fa index"


def _env() -> jinja2.Environment:
    loader = jinja2.FileSystemLoader(Path(__file__).parent / "templates")
    return jinja2.Environment(loader=loader, autoescape=True, keep_trailing_newline=True)


def write_index(wheel_dir: Path) -> dict[str, Any]:
    """(Re)write wheel_dir/index.json, wheel_dir/simple/, wheel_dir/<variant index>/simple/ and
    wheel_dir/index.html from the *.whl files there."""
    wheels = sorted(wheel_dir.glob("fa_attn-*.whl"))  # temporaries are named *.whl.fa-tmp-*: not matched
    entries = [wheel_entry(p) for p in wheels]
    index = schema.index_json(entries)
    atomic.write_json(wheel_dir / "index.json", index)
    names = install_lines.index_names(entries)
    env = _env()
    for name in (None, *names):
        _write_simple(env, wheel_dir, name, install_lines.index_members(entries, name))
    _remove_stale(wheel_dir, set(names))
    index_page.write_page(wheel_dir, schema.read_index(index))  # the order doctor reads: all-wheels last
    return index


def _write_simple(
    env: jinja2.Environment, wheel_dir: Path, name: str | None, members: list[schema.IndexEntry]
) -> None:
    simple = wheel_dir / install_lines.index_path(name)
    atomic.write_text(
        simple / "index.html", env.get_template("root.html.j2").render(projects=[schema.PACKAGE])
    )
    # wheels/<index path>/fa-attn/index.html -> ../ per folder back up to wheels/, where the files are
    depth = install_lines.index_path(name).count("/") + 1
    page = env.get_template("project.html.j2").render(
        project=schema.PACKAGE,
        wheels=[e.to_json() for e in members],
        prefix="../" * depth,
        generator=GENERATOR,
    )
    atomic.write_text(simple / schema.PACKAGE / "index.html", page)


def _remove_stale(wheel_dir: Path, current: set[str]) -> None:
    """Remove the variant indexes an earlier `fa index` wrote for wheels no longer here: left behind,
    they would send pip to files that are gone. Only pages carrying fa's generator mark, and the
    folders they leave empty; nothing else."""
    marker = f'<meta name="generator" content="{GENERATOR}">'
    for page in sorted(wheel_dir.glob(f"*/{install_lines.SIMPLE}/{schema.PACKAGE}/index.html")):
        name = page.parents[2].name
        if name in current or page.parents[2].is_symlink():
            continue
        try:
            if marker not in page.read_text(errors="replace"):
                continue
            page.unlink()
            (page.parents[1] / "index.html").unlink(missing_ok=True)
            for folder in (page.parent, page.parents[1], page.parents[2]):
                folder.rmdir()  # OSError if anything else is in it: then it stays
        except OSError:
            continue
