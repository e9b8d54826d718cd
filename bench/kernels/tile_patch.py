"""The autotuner's winners as a patch to kernels/tiles.py, checked by loading the patched file.

tiles.py keeps one default tile per (arch family, direction, head-dim bucket) in the `fwd=` and `bwd=`
tables of FAMILIES (docs/contracts.md section 2). `patch_text` rewrites the entries of the buckets
whose winner differs, each as the table writes tiles (`_T(128, 64, 8)`: the module's alias of the
tile class, the dataclass fields in order, trailing defaults left out). A table the family shares with
another (`bwd=_BWD_SM80`), that another table is built from (`{**_FWD_SM80, ...}`) or that it computes
(a dict comprehension) becomes the family's own literal, so any other family keeps its tiles. The patched source is then
loaded as a module and every family's default_tile is compared with what was asked: the patch is
returned only if exactly the winners changed. A table laid out otherwise raises PatchError, and the
winners (autotune.json) are applied by hand.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TILES = REPO / "kernels" / "tiles.py"


class PatchError(RuntimeError):
    """tiles.py's tables are not where the patch writer looks, or the patched file disagrees."""


# (family name, direction) -> {bucket: tile}
Changes = dict[tuple[str, str], dict[int, Any]]


def _assigned(tree: ast.Module, name: str) -> ast.expr | None:
    """The value a module-level `name = ...` or `name: T = ...` assigns, if any."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets: list[ast.expr] = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if node.value is not None and any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node.value
    return None


def _family_call(tree: ast.Module, family: str) -> ast.Call:
    families = _assigned(tree, "FAMILIES")
    if isinstance(families, ast.Dict):
        for key, value in zip(families.keys, families.values, strict=False):
            if isinstance(key, ast.Constant) and key.value == family and isinstance(value, ast.Call):
                return value
    raise PatchError(f"tiles.py: no FAMILIES[{family!r}] = ArchFamily(...) literal to patch")


def _own_literal(tree: ast.Module, value: ast.expr) -> ast.Dict | None:
    """The dict literal of int buckets a family's table is, written inline or as a module-level name
    nothing else reads (no other family's keyword, no table built from it: `{**_FWD_SM80, ...}`); None
    for anything else (shared, or computed)."""
    if isinstance(value, ast.Name):
        users = sum(
            isinstance(node, ast.Name) and node.id == value.id and isinstance(node.ctx, ast.Load)
            for node in ast.walk(tree)
        )
        assigned = _assigned(tree, value.id)
        value = assigned if users == 1 and assigned is not None else value
    if isinstance(value, ast.Dict) and all(
        isinstance(k, ast.Constant) and isinstance(k.value, int) for k in value.keys
    ):
        return value
    return None


def _alias(tree: ast.Module, cls_name: str) -> str:
    """The short name tiles.py writes tiles with (`_T = FwdTile`), else the class name."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Name)
            and node.value.id == cls_name
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            return node.targets[0].id
    return cls_name


def render(tile: Any, alias: str) -> str:
    """`_T(128, 64, 8)`: the fields in order, trailing ones at their defaults left out as tiles.py does."""
    fields = dataclasses.fields(tile)
    values = [getattr(tile, f.name) for f in fields]
    n = len(fields)
    while n and fields[n - 1].default is not dataclasses.MISSING and values[n - 1] == fields[n - 1].default:
        n -= 1
    return f"{alias}({', '.join(repr(v) for v in values[:n])})"


def _offset(lines: list[str], lineno: int, col: int) -> int:
    """Character offset of (1-based line, 0-based UTF-8 byte column); tiles.py is ASCII where it matters."""
    return sum(len(line) for line in lines[: lineno - 1]) + col


def patch_text(source: str, changes: Changes, tiles_module: Any) -> str:
    """`source` (tiles.py) with every (family, direction) table given the changed buckets' tiles."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement)
    for (family, direction), buckets in sorted(changes.items()):
        if not buckets:
            continue
        call = _family_call(tree, family)
        kw = next((k for k in call.keywords if k.arg == direction), None)
        if kw is None:
            raise PatchError(f"tiles.py: FAMILIES[{family!r}] has no {direction}= table")
        alias = _alias(tree, type(next(iter(buckets.values()))).__name__)
        target = _own_literal(tree, kw.value)
        if target is not None:  # the family's own dict literal: rewrite the changed entries in place
            for key, value in zip(target.keys, target.values, strict=False):
                if isinstance(key, ast.Constant) and isinstance(key.value, int) and key.value in buckets:
                    start = _offset(lines, value.lineno, value.col_offset)
                    end = _offset(lines, value.end_lineno or value.lineno, value.end_col_offset or 0)
                    edits.append((start, end, render(buckets[key.value], alias)))
            missing = set(buckets) - {k.value for k in target.keys if isinstance(k, ast.Constant)}
            if missing:
                raise PatchError(
                    f"tiles.py: {family} {direction}= has no entry for buckets {sorted(missing)}"
                )
        else:
            # A table shared with another family (`bwd=_BWD_SM80`) or computed (a comprehension, `{**a,
            # ...}`): this family gets its own literal with the winners; the others keep theirs.
            table = dict(getattr(tiles_module.FAMILIES[family], direction))
            table.update(buckets)
            indent = " " * (kw.col_offset + 4)
            body = "".join(f"{indent}{d}: {render(t, alias)},\n" for d, t in sorted(table.items()))
            start = _offset(lines, kw.value.lineno, kw.value.col_offset)
            end = _offset(lines, kw.value.end_lineno or kw.value.lineno, kw.value.end_col_offset or 0)
            edits.append((start, end, "{\n" + body + " " * kw.col_offset + "}"))
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    return out


def _load(path: Path) -> Any:
    name = f"_fa_tiles_patched_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec
    assert spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(name, None)
    return mod


def verify(before: Any, patched_source: str, changes: Changes) -> None:
    """Load the patched tiles.py beside the original (its _KERNELS_DIR must see csrc/) and compare
    every family's tables: the changed buckets hold the winners, everything else is as before."""
    with tempfile.NamedTemporaryFile(
        "w", suffix=".py", dir=TILES.parent, prefix=".tiles_patched_", delete=False
    ) as f:
        f.write(patched_source)
        path = Path(f.name)
    try:
        after = _load(path)
    except Exception as e:
        raise PatchError(f"the patched tiles.py does not load: {type(e).__name__}: {e}") from e
    finally:
        path.unlink(missing_ok=True)
    for family, fam in before.FAMILIES.items():
        for direction in ("fwd", "bwd"):
            want = dict(getattr(fam, direction))
            want.update(changes.get((family, direction), {}))
            got = {d: t for d, t in getattr(after.FAMILIES[family], direction).items()}
            got = {d: type(want[d])(**dataclasses.asdict(t)) if d in want else t for d, t in got.items()}
            if got != want:
                raise PatchError(f"the patched tiles.py's {family} {direction} table is {got}, not {want}")


def unified_diff(source: str, patched: str) -> str:
    return "".join(
        difflib.unified_diff(
            source.splitlines(keepends=True),
            patched.splitlines(keepends=True),
            "a/kernels/tiles.py",
            "b/kernels/tiles.py",
        )
    )


def make_patch(changes: Changes, tiles_path: Path = TILES) -> str:
    """The unified diff (git apply -p1) that puts `changes` into tiles.py; '' when nothing changes."""
    if not any(changes.values()):
        return ""
    before = _load(tiles_path)
    source = tiles_path.read_text()
    patched = patch_text(source, changes, before)
    verify(before, patched, changes)
    return unified_diff(source, patched)
