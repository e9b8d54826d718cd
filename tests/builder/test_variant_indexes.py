"""`fa index` writes one PEP 503 index per variant (buildtool/builder/index.py), keeps them in step with
the wheels there, and never touches what it did not write."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

from typer.testing import CliRunner

from buildtool.cli import app
from buildtool.core import install_lines
from tests.select.fixture_index import kernel_entry, universal_entry
from tests.select.tiny_wheels import build_wheel


def _wheels(out: Path) -> Path:
    out.mkdir()
    for entry in (kernel_entry(12, "2.9", True), kernel_entry(13, "2.10", None), universal_entry()):
        build_wheel(out, entry)
    return out


def _index(directory: Path) -> None:
    result = CliRunner().invoke(app, ["index", str(directory)])
    assert result.exit_code == 0, result.output


def test_one_index_per_variant_plus_root_and_universal(tmp_path: Path) -> None:
    out = _wheels(tmp_path / "wheels")
    _index(out)
    pages = sorted(str(p.relative_to(out)) for p in out.glob("**/fa-attn/index.html"))
    assert pages == [
        "cu12-torch2.9/simple/fa-attn/index.html",
        "cu13/simple/fa-attn/index.html",
        "simple/fa-attn/index.html",
        "universal/simple/fa-attn/index.html",
    ]


def test_every_link_of_every_page_reaches_its_wheel(tmp_path: Path) -> None:
    out = _wheels(tmp_path / "wheels")
    _index(out)
    for page in out.glob("**/fa-attn/index.html"):
        for href in re.findall(r'href="([^"#]+)#sha256=', page.read_text()):
            target = (page.parent / urllib.parse.unquote(href)).resolve()
            assert target.parent == out.resolve(), (page, href)
            assert target.is_file(), (page, href)


def test_a_variant_whose_wheels_are_gone_loses_its_index(tmp_path: Path) -> None:
    out = _wheels(tmp_path / "wheels")
    _index(out)
    next(out.glob("fa_attn-*cu12torch2.9*.whl")).unlink()
    _index(out)
    assert not (out / "cu12-torch2.9").exists()


def test_a_folder_fa_did_not_write_is_left_alone(tmp_path: Path) -> None:
    out = _wheels(tmp_path / "wheels")
    mine = out / "mine" / install_lines.SIMPLE / "fa-attn" / "index.html"
    mine.parent.mkdir(parents=True)
    mine.write_text("<html>my own page</html>")
    _index(out)
    assert mine.read_text() == "<html>my own page</html>"


def test_a_stale_index_holding_a_user_file_keeps_that_file(tmp_path: Path) -> None:
    out = _wheels(tmp_path / "wheels")
    _index(out)
    note = out / "cu12-torch2.9" / "NOTES.txt"
    note.write_text("mine")
    next(out.glob("fa_attn-*cu12torch2.9*.whl")).unlink()
    _index(out)
    assert (note.read_text(), (out / "cu12-torch2.9" / "simple").exists()) == ("mine", False)
