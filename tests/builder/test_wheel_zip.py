"""The wheels' zip writer (package._write_zip): the same bytes zipfile writes for the same members, and
each distinct member deflated once across the wheels of a build.

fa wrote its wheels with zipfile.ZipFile.writestr until deflating every cubin again for every wheel of
its CUDA major (and for the all-wheel) was the most CPU its own process spent in a cold release build;
the writer that replaced it must not change a byte of any wheel."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from buildtool.builder import package

DIST_INFO = "fa_attn-0.1.0.dist-info"


def _files() -> dict[str, bytes]:
    """Members like a wheel's: text, a compressible binary, an incompressible one, an empty file, a
    shared object (mode 0755), a name that is not ASCII, and the dist-info last."""
    noise = hashlib.shake_256(b"fa").digest(200_000)  # does not deflate: stored bigger than it is
    return {
        "fa_attn/__init__.py": b"from .api import *\n" * 50,
        "fa_attn/kernels/sm_80/fwd.cubin": bytes(range(256)) * 700,
        "fa_attn/kernels/sm_90/fwd.cubin": noise,
        "fa_attn/py.typed": b"",
        "fa_attn/libfa_attn_ops.so": b"\x7fELF" + noise[:5000],
        "fa_attn/données.txt": "naïve\n".encode(),
        f"{DIST_INFO}/METADATA": b"Metadata-Version: 2.1\nName: fa-attn\n",
        f"{DIST_INFO}/RECORD": b"fa_attn/__init__.py,sha256=x,900\n",
    }


def _zipfile_wheel(path: Path, files: dict[str, bytes]) -> None:
    """What package._write_zip wrote before it was replaced: zipfile, one writestr per member."""
    with zipfile.ZipFile(path, "w") as zf:
        for arc in sorted(files, key=lambda a: (a.startswith(DIST_INFO), a.endswith("/RECORD"), a)):
            info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if arc.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, files[arc])


def _written(path: Path, files: dict[str, bytes]) -> bytes:
    digests = {arc: hashlib.sha256(data).digest() for arc, data in files.items()}
    package._write_zip(path, files, digests, DIST_INFO)
    return path.read_bytes()


@pytest.mark.skipif(sys.platform == "win32", reason="zipfile marks members made on Windows as such")
def test_the_writer_gives_zipfiles_bytes(tmp_path: Path) -> None:
    files = _files()
    _zipfile_wheel(tmp_path / "zipfile.whl", files)
    assert _written(tmp_path / "fa.whl", files) == (tmp_path / "zipfile.whl").read_bytes()
    with zipfile.ZipFile(tmp_path / "fa.whl") as zf:
        assert zf.testzip() is None
        assert {i.filename: zf.read(i) for i in zf.infolist()} == files
        assert zf.getinfo("fa_attn/libfa_attn_ops.so").external_attr >> 16 == 0o755


def test_a_member_in_many_wheels_is_deflated_once_and_gives_the_same_bytes(tmp_path: Path) -> None:
    package._DEFLATED.clear()
    files = _files()
    first = _written(tmp_path / "a.whl", files)
    distinct = {hashlib.sha256(d).digest() for d in files.values()}
    assert set(package._DEFLATED) == distinct
    kept = dict(package._DEFLATED)
    # A second wheel of the same members and one more: only the new member is deflated, and the
    # members taken from the memo give the bytes a fresh deflate gives.
    more = {**files, "fa_attn/kernels/sm_86/fwd.cubin": b"another image" * 99}
    _written(tmp_path / "b.whl", more)
    assert len(package._DEFLATED) == len(distinct) + 1
    assert all(package._DEFLATED[d] is kept[d] for d in distinct)
    package._DEFLATED.clear()
    assert _written(tmp_path / "c.whl", files) == first


def test_pip_installs_a_written_wheel(tmp_path: Path) -> None:
    """The members' CRCs, sizes and offsets as pip reads them (fa's own wheel checks read the
    wheels of real builds: tests/builder/test_package_index.py)."""
    files = {"fa_attn/__init__.py": b"ANSWER = 42\n", "fa_attn/libfa_attn_ops.so": b"\x7fELF" * 300}
    metadata = b"Metadata-Version: 2.1\nName: fa-attn\nVersion: 0.1.0\n"
    files[f"{DIST_INFO}/METADATA"] = metadata
    files[f"{DIST_INFO}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: fa build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    digests = {arc: hashlib.sha256(data).digest() for arc, data in files.items()}
    files[f"{DIST_INFO}/RECORD"] = package._record(files, digests, f"{DIST_INFO}/RECORD")
    wheel = tmp_path / "fa_attn-0.1.0-py3-none-any.whl"
    _written(wheel, files)
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    assert (target / "fa_attn" / "__init__.py").read_bytes() == b"ANSWER = 42\n"
    assert (target / "fa_attn" / "libfa_attn_ops.so").read_bytes() == b"\x7fELF" * 300
