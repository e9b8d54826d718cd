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

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from buildtool.builder import out_files
from buildtool.core import cache, install_lines, wheel_members
from buildtool.core.runtime import schema
from buildtool.core.wheel_file import wheel_entry

if TYPE_CHECKING:
    import jinja2

# In every page fa writes: what `fa index DIR` may take over of files not in out_files' record.
GENERATOR = out_files.GENERATOR


def _env() -> jinja2.Environment:
    import jinja2  # here: a build with nothing changed writes no page

    loader = jinja2.FileSystemLoader(Path(__file__).parent / "templates")
    return jinja2.Environment(loader=loader, autoescape=True, keep_trailing_newline=True)


def write_index(wheel_dir: Path, *, take_over: bool = False) -> dict[str, Any]:
    """(Re)write wheel_dir/index.json, wheel_dir/simple/, wheel_dir/<variant index>/simple/ and
    wheel_dir/index.html from the *.whl files there: every one, whoever wrote it (other platforms'
    wheels copied in are merged), except that a wheel fa wrote must still have the sha256 it wrote. The
    index files are replaced only if fa wrote them (out_files' record), unless `take_over` (`fa index
    DIR`, asked to rewrite them: then also those fa made elsewhere, a shard's; never a user's own); the
    page never replaces a user's index.html; nothing is written through a link. A wheel fa install
    would refuse (core/wheel_members.py) is refused here, before anything is written."""
    wheels = sorted(wheel_dir.glob("fa_attn-*.whl"))  # temporaries are named *.whl.fa-tmp-*: not matched
    key = _key(wheel_dir, wheels, take_over)
    if (kept := _unchanged(wheel_dir, key)) is not None:
        return kept
    from buildtool.builder import index_page  # here: its answers import compat/

    entries = []
    for path in wheels:
        out_files.inside(wheel_dir, path.name)  # a linked wheel is not followed
        entry = wheel_entry(path)
        out_files.check_kept(wheel_dir, path.name, entry.sha256)
        try:  # what fa install would refuse is not listed: files outside fa_attn/, links, a zip bomb
            wheel_members.check(path, entry)
        except wheel_members.HostileWheel as exc:
            raise exc.with_outcome("nothing indexed") from None
        entries.append(entry)
    index = schema.index_json(entries)
    out_files.write_json(wheel_dir, "index.json", index, take_over=take_over)
    names = install_lines.index_names(entries)
    env = _env()
    for name in (None, *names):
        _write_simple(env, wheel_dir, name, install_lines.index_members(entries, name), take_over)
    _remove_stale(wheel_dir, set(names))
    index_page.write_page(wheel_dir, schema.read_index(index))  # the order doctor reads: all-wheels last
    _stamp(wheel_dir, key, ["index.json", *_simple_pages(names), index_page.PAGE])
    return index


# The index's stamp (core/cache.py): the wheels by name and state give the same files, so a build with
# nothing changed reads no wheel and renders no page; the stamp holds each output's state and the
# sha256 fa recorded for it, and any output changed, removed or no longer fa's since makes a rewrite.
_STAMPS = "index"


def _key(wheel_dir: Path, wheels: list[Path], take_over: bool) -> str:
    parts = [json.dumps([p.name, cache.file_state(p)]) for p in wheels]
    return cache.content_key(
        "fa-index", cache.own_code_hash(), str(wheel_dir.resolve()), str(take_over), *parts
    )


def _simple_pages(names: Iterable[str]) -> list[str]:
    out: list[str] = []
    for name in (None, *names):
        simple = install_lines.index_path(name).rstrip("/")
        out += [f"{simple}/index.html", f"{simple}/{schema.PACKAGE}/index.html"]
    return out


def _stamp(wheel_dir: Path, key: str, rels: list[str]) -> None:
    recorded = out_files.written(wheel_dir)
    outputs = {rel: [cache.file_state(wheel_dir / rel), (recorded.get(rel) or [""])[-1]] for rel in rels}
    cache.write_stamp(_STAMPS, key, {"outputs": outputs})


def _unchanged(wheel_dir: Path, key: str) -> dict[str, Any] | None:
    """index.json's content when every output is as the stamp of `key` says fa left it; else None."""
    stamp = cache.read_stamp(_STAMPS, key)
    outputs = stamp.get("outputs") if stamp else None
    if not isinstance(outputs, dict) or "index.json" not in outputs:
        return None
    recorded = out_files.written(wheel_dir)
    for rel, kept in outputs.items():
        if not (isinstance(kept, list) and len(kept) == 2):
            return None
        state, sha = kept
        out_files.inside(wheel_dir, rel)  # a link put in since is refused, as on a rewrite
        if cache.file_state(wheel_dir / rel) != state or (
            sha is not None and sha not in recorded.get(rel, [])
        ):
            return None
    try:
        data = json.loads((wheel_dir / "index.json").read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_simple(
    env: jinja2.Environment,
    wheel_dir: Path,
    name: str | None,
    members: list[schema.IndexEntry],
    take_over: bool,
) -> None:
    simple = install_lines.index_path(name).rstrip("/")  # "simple" or "cu12/simple": the record's keys
    root_page = env.get_template("root.html.j2").render(projects=[schema.PACKAGE], generator=GENERATOR)
    out_files.write_text(wheel_dir, f"{simple}/index.html", root_page, take_over=take_over)
    # wheels/<index path>/fa-attn/index.html -> ../ per folder back up to wheels/, where the files are
    depth = simple.count("/") + 2
    page = env.get_template("project.html.j2").render(
        project=schema.PACKAGE,
        wheels=[e.to_json() for e in members],
        prefix="../" * depth,
        generator=GENERATOR,
    )
    out_files.write_text(wheel_dir, f"{simple}/{schema.PACKAGE}/index.html", page, take_over=take_over)


def _remove_stale(wheel_dir: Path, current: set[str]) -> None:
    """Remove the variant indexes fa wrote for wheels no longer here: left behind, they would send pip
    to files that are gone. Only pages in the record of what fa wrote, unchanged since, and the folders
    they leave empty; nothing else."""
    recorded = out_files.written(wheel_dir)
    for page in sorted(wheel_dir.glob(f"*/{install_lines.SIMPLE}/{schema.PACKAGE}/index.html")):
        name = page.parents[2].name
        if name in current or page.parents[2].is_symlink():
            continue
        rels = [
            f"{name}/{install_lines.SIMPLE}/{schema.PACKAGE}/index.html",
            f"{name}/{install_lines.SIMPLE}/index.html",
        ]
        if rels[0] not in recorded or not out_files.own(wheel_dir, rels[0]):
            continue
        try:
            for rel in rels:
                if out_files.own(wheel_dir, rel):
                    (wheel_dir / rel).unlink(missing_ok=True)
            for folder in (page.parent, page.parents[1], page.parents[2]):
                folder.rmdir()  # OSError if anything else is in it: then it stays
        except OSError:
            continue
