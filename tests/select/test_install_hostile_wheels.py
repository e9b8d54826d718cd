"""Wheels with a correct sha256 and hostile contents, served over HTTP on 127.0.0.1: each is refused
before any installer sees it, naming the member, and the environment is left exactly as it was. And a
downgrade needs --allow-downgrade."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import stat
import struct
import subprocess
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from buildtool.compat.probe import probe
from buildtool.compat.wheel_index import entry_from_wheel
from buildtool.core import wheel_members
from buildtool.core.runtime import schema
from tests.select.conftest import make_venv, run_fa
from tests.select.fixture_index import kernel_entry
from tests.select.test_install import expected_variant, installed
from tests.select.tiny_wheels import build_wheel, build_wheelhouse

pytestmark = pytest.mark.slow

Members = dict[str, bytes]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("venv") / "v")


def _entry() -> dict:
    torch = probe().torch
    assert torch is not None
    return kernel_entry(13, torch.minor, bool(torch.cxx11abi))


def _record(members: Members, dist_info: str) -> bytes:
    rows = []
    for name, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(data)}")
    rows.append(f"{dist_info}/RECORD,,")
    return ("\n".join(rows) + "\n").encode()


def hostile_house(
    out: Path,
    extra: Members | None = None,
    record: Callable[[bytes], bytes] = lambda r: r,
    unlisted: Members | None = None,
    symlink: str | None = None,
    patch: Callable[[Path], None] | None = None,
) -> Path:
    """A one-wheel index of this machine's variant, its own metadata and manifest right, plus `extra`
    members (in RECORD), `unlisted` ones (not in RECORD), a `symlink` member; `record` edits RECORD,
    `patch` the finished file. index.json has the finished wheel's true size and sha256."""
    out.mkdir(parents=True)
    entry = _entry()
    good = build_wheel(out, entry)  # the honest wheel's members, read back
    with zipfile.ZipFile(good) as zf:
        members = {n: zf.read(n) for n in zf.namelist() if not n.endswith("/RECORD")}
    dist_info = f"fa_attn-{entry['version']}.dist-info"
    members.update(extra or {})
    with zipfile.ZipFile(good, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        for name, data in (unlisted or {}).items():
            zf.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "../../torch/__init__.py")
        zf.writestr(f"{dist_info}/RECORD", record(_record(members, dist_info)))
    if patch:
        patch(good)
    index = schema.index_json([entry_from_wheel(good)])
    (out / "index.json").write_text(json.dumps(index))
    return out


def _lie_about_sizes(members: str, size: int) -> Callable[[Path], None]:
    """Make the central directory say each member whose name starts with `members` unpacks to `size`
    bytes (packed: half of it)."""

    def patch(wheel: Path) -> None:
        data = bytearray(wheel.read_bytes())
        at = data.find(b"PK\x01\x02")  # a central directory entry
        while at != -1:
            name_len = struct.unpack_from("<H", data, at + 28)[0]
            if data[at + 46 : at + 46 + name_len].decode().startswith(members):
                struct.pack_into("<II", data, at + 20, size // 2, size)
            at = data.find(b"PK\x01\x02", at + 4)
        wheel.write_bytes(bytes(data))

    return patch


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("served")
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", root
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def _site_listing(python: Path) -> set[str]:
    site = next((python.parent.parent / "lib").glob("python*/site-packages"))
    return {str(p.relative_to(site)) for p in site.rglob("*")}


def _dist_info() -> str:
    return f"fa_attn-{_entry()['version']}.dist-info"


ZEROS = b"\0" * (3 << 20)  # deflates about 1000 to 1

CASES: dict[str, tuple[dict, str, str]] = {
    "another package": (
        {"extra": {"torch/__init__.py": b"evil = 1\n"}},
        "torch/__init__.py",
        "outside fa_attn/",
    ),
    "scripts": (
        {"extra": {"{data}/scripts/fa-evil": b"#!/bin/sh\n"}},
        "{data}/scripts/fa-evil",
        "a .data folder",
    ),
    "a .pth": ({"extra": {"fa_attn/evil.pth": b"import os\n"}}, "fa_attn/evil.pth", "a .pth file"),
    "an absolute path": ({"extra": {"/tmp/fa-evil": b"x"}}, "/tmp/fa-evil", "an absolute path"),
    "a .. path": ({"extra": {"fa_attn/../torch/evil.py": b"x"}}, "fa_attn/../torch/evil.py", "'..' part"),
    "a symlink": ({"symlink": "fa_attn/link.py"}, "fa_attn/link.py", "a symbolic link"),
    "a member RECORD omits": (
        {"unlisted": {"fa_attn/extra.py": b"x = 1\n"}},
        "fa_attn/extra.py",
        "not listed in RECORD",
    ),
    "RECORD's hash wrong": (
        {"record": lambda r: r.replace(b"fa_attn/__init__.py,sha256=", b"fa_attn/__init__.py,sha256=A")},
        "fa_attn/__init__.py",
        "do not match RECORD",
    ),
    "RECORD lists a missing file": (
        {"record": lambda r: r + b"fa_attn/gone.py,sha256=AAAA,3\n"},
        "fa_attn/gone.py",
        "listed in RECORD but not in the wheel",
    ),
    "a member twice": (
        {"unlisted": {"fa_attn/__init__.py": b"evil = 1\n"}},
        "fa_attn/__init__.py",
        "in the archive twice",
    ),
    "a compression bomb": (
        {"extra": {"fa_attn/zeros.bin": ZEROS}},
        "fa_attn/zeros.bin",
        "more than 200 times",
    ),
    "a 300 MB member": (
        {"extra": {"fa_attn/big.bin": b"x"}, "patch": _lie_about_sizes("fa_attn/big.bin", 300_000_000)},
        "fa_attn/big.bin",
        "300000000 bytes unpacked",
    ),
    "2.25 GiB in all": (
        {
            "extra": {f"fa_attn/part{i}.bin": b"x" for i in range(9)},
            "patch": _lie_about_sizes("fa_attn/part", 250 << 20),
        },
        "",
        "bytes unpacked (at most 2147483648)",
    ),
    "20,001 members": (
        {"extra": {f"fa_attn/m{i}.py": b"" for i in range(wheel_members.MAX_MEMBERS)}},
        "",
        "members (at most 20000)",
    ),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_a_hostile_member_is_refused_and_nothing_changes(
    venv: Path, server: tuple[str, Path], tmp_path: Path, kind: str
):
    spec, member, problem = CASES[kind]
    data = _dist_info().removesuffix(".dist-info") + ".data"  # this very wheel's .data folder
    spec = {**spec, "extra": {k.replace("{data}", data): v for k, v in spec.get("extra", {}).items()}}
    member = member.replace("{data}", data)
    url, root = server
    folder = kind.replace(" ", "-").replace(".", "dot").replace("'", "")
    hostile_house(root / folder, **spec)
    before = _site_listing(venv)
    done = run_fa(venv, "install", "--index", url + folder + "/", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert member in out["message"], out["message"]
    assert problem in out["message"], out["message"]
    assert "nothing installed" in out["message"]
    assert "Traceback" not in done.stderr
    assert installed(venv) is None
    assert _site_listing(venv) - before <= {".fa-attn-install", ".fa-attn-install/lock"}


def test_a_wheel_index_entry_with_other_tags_is_refused(tmp_path: Path):
    """The file name's tags must be the index entry's (checked before the members)."""
    house = hostile_house(tmp_path / "h")
    entry = entry_from_wheel(next(house.glob("*.whl")))
    other = schema.IndexEntry(**{**entry.__dict__, "platform_tag": "manylinux_2_17_x86_64"})
    with pytest.raises(wheel_members.HostileWheel, match="the index says py3-none-manylinux_2_17_x86_64"):
        wheel_members.check(next(house.glob("*.whl")), other)


def test_the_honest_wheel_passes(tmp_path: Path):
    house = hostile_house(tmp_path / "h")
    wheel = next(house.glob("*.whl"))
    contents = wheel_members.check(wheel, entry_from_wheel(wheel))
    assert contents.unpacked_bytes > 0
    assert not contents.purelib


def test_an_older_version_needs_allow_downgrade(tmp_path: Path):
    venv = make_venv(tmp_path / "v")
    torch = probe().torch
    assert torch is not None
    new = build_wheelhouse(tmp_path / "new", torch.minor, bool(torch.cxx11abi), version="0.2.0")
    old = build_wheelhouse(tmp_path / "old", torch.minor, bool(torch.cxx11abi), version="0.1.0")

    def fa(*args: str) -> subprocess.CompletedProcess[str]:
        return run_fa(venv, "install", *args, "--json", cwd=tmp_path)

    assert fa("--wheels", str(new)).returncode == 0
    refused = fa("--wheels", str(old))
    assert refused.returncode == 1
    message = json.loads(refused.stdout)["message"]
    assert "a downgrade" in message
    assert "--allow-downgrade" in message
    assert installed(venv) == f"0.2.0+{expected_variant()}"
    allowed = fa("--wheels", str(old), "--allow-downgrade")
    assert allowed.returncode == 0, allowed.stdout
    assert installed(venv) == f"0.1.0+{expected_variant()}"
