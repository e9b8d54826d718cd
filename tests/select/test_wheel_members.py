"""The member check is total: whatever names, bytes and RECORD a wheel carries, it either passes or
is refused with fa's own error naming the wheel; and whatever passes lands only under fa_attn/ and the
wheel's own .dist-info, as plain relative paths, each member as RECORD lists it."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from buildtool.core import wheel_members
from buildtool.core.runtime import schema
from tests.select.fixture_index import kernel_entry

ENTRY = schema.IndexEntry.from_json(kernel_entry(12, "2.9", True), "")
DIST_INFO = f"fa_attn-{ENTRY.info.version}.dist-info"
# The parts hostile names are made of: fa's own folders, other packages, traversal, odd characters.
PARTS = st.sampled_from(
    [
        "fa_attn",
        DIST_INFO,
        "torch",
        "..",
        ".",
        "",
        "x.pth",
        "a.py",
        f"{DIST_INFO[:-10]}.data",
        "scripts",
        "C:",
        "\\",
        "a\\b",
        "\x1b[2J",
        "é",
        "RECORD",
        "METADATA",
        "WHEEL",
        "__init__.py",
    ]
)
NAMES = st.lists(PARTS, min_size=1, max_size=4).map("/".join) | st.text(max_size=30)


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(tmp: Path, members: list[tuple[str, bytes]], record_extra: str, honest_record: bool) -> Path:
    path = tmp / ENTRY.file
    rows = [f"{n},sha256={_digest(d)},{len(d)}" for n, d in members] if honest_record else []
    record = "\n".join([*rows, f"{DIST_INFO}/RECORD,,", record_extra]) + "\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members:
            zf.writestr(zipfile.ZipInfo(name) if name else zipfile.ZipInfo("_"), data)
        zf.writestr(f"{DIST_INFO}/RECORD", record)
    return path


@given(
    members=st.lists(st.tuples(NAMES, st.binary(max_size=64)), max_size=6),
    record_extra=st.text(max_size=40),
    honest_record=st.booleans(),
)
@example(members=[("fa_attn/__init__.py", b"x = 1\n")], record_extra="", honest_record=True)
def test_a_wheel_either_passes_clean_or_is_refused_by_name(
    tmp_path_factory: pytest.TempPathFactory,
    members: list[tuple[str, bytes]],
    record_extra: str,
    honest_record: bool,
):
    tmp = tmp_path_factory.mktemp("w")
    wheel = _wheel(tmp, members, record_extra, honest_record)
    try:
        contents = wheel_members.check(wheel, ENTRY)
    except wheel_members.HostileWheel as exc:
        message = str(exc)
        assert message.startswith(ENTRY.file)
        assert "nothing installed" in message
        assert all(line.isprintable() for line in message.split("\n"))
        assert len(message) < 2000
        return
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    for name in names:
        parts = PurePosixPath(name).parts
        assert parts[0] in ("fa_attn", DIST_INFO)
        assert not {"..", ".", ""} & set(name.rstrip("/").split("/"))
        assert "\\" not in name
        assert name.isprintable()
        assert not name.endswith(".pth")
    assert len(set(names)) == len(names)
    assert contents.unpacked_bytes == sum(len(d) for _, d in members)


def test_a_wheel_fa_build_writes_passes(tmp_path: Path):
    """fa's own packager's wheels (modes without type bits, RECORD last) are what the check expects."""
    from buildtool.builder.package import write_wheel
    from buildtool.compat.wheel_index import entry_from_wheel
    from tests.select.fixture_index import PLATFORM, kernel_manifest

    manifest = kernel_manifest(12, "2.9", True)
    files = {"fa_attn/__init__.py": b"x = 1\n", "fa_attn/kernels/a.cubin": bytes(range(256)) * 64}
    wheel = write_wheel(files, manifest, manifest.info.version, PLATFORM, tmp_path)
    contents = wheel_members.check(wheel, entry_from_wheel(wheel))
    assert contents.unpacked_bytes > len(files["fa_attn/kernels/a.cubin"])
    assert not contents.purelib
