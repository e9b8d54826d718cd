"""Plain pip and uv, pointed at the per-variant index `fa doctor` names, install the wheel `fa install`
picks: for machines of the env corpus (torch x CUDA x no GPU) whose platform is this one's, real pip and
real uv install into fresh venvs, offline, from a local HTTP server on 127.0.0.1 and from file://.

The wheels are tiny real ones (tiny_wheels.py) named and described like the release matrix's
(fixture_index.py), indexed by `fa index`'s own code (buildtool/builder/index.py); the lines are
buildtool/core/install_lines.py's, run as printed (pip as `python -m pip --python <venv>`, which is
the same pip installing into the venv). Which wheel got installed is read back from the venv: its
version and WHEEL tag name one file.
"""

from __future__ import annotations

import email.parser
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from buildtool.builder import index
from buildtool.compat.choose import Request, select
from buildtool.compat.env import env_from_json
from buildtool.core import install_lines
from buildtool.core.runtime import schema
from tests.builder.range_server import serve
from tests.select.fixture_index import all_wheel_index, fixture_index
from tests.select.tiny_wheels import build_wheel

ENVS = Path(__file__).parent / "envs"
# No network but 127.0.0.1, no user or site configuration, no cache shared with anything.
OFFLINE = {
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_NO_CACHE_DIR": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "UV_NO_CONFIG": "1",
    "UV_NO_CACHE": "1",
    "UV_PYTHON_DOWNLOADS": "never",
    "NO_PROXY": "127.0.0.1",
    "no_proxy": "127.0.0.1",
}
for _proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
    OFFLINE[_proxy] = ""

# torch x CUDA x no GPU, one per index kind; pip runs these (about 2 s each), uv every distinct choice.
PIP_CASES = (
    "aws-a10g-pypi-torch",  # torch 2.5.1 from PyPI (old C++ ABI), cu124, A10G -> cu12-torch2.5-cxx11abifalse
    "a100-ngc-24.10",  # NGC's torch 2.5 (C++11 ABI) -> cu12-torch2.5-cxx11abitrue
    "driver520-torch-cu118",  # torch +cu118, driver 520 -> cu11-torch2.5-cxx11abifalse
    "torch29-below-stable-floor",  # torch 2.9 -> cu12-torch2.9
    "ngc-torch212-stable-abi",  # torch 2.12 -> cu12 (the stable-ABI wheel)
    "cpu-only-torch",  # torch 2.13+cpu, no GPU, no driver -> cu13
    "torch28-old-abi",  # no wheel's binding serves it -> universal
)


def _uv() -> str:
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(uv).is_file():
        pytest.fail("uv is not installed (pyproject.toml's test extra installs it)")
    return uv


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        argv, cwd=cwd, env={**os.environ, **OFFLINE}, capture_output=True, text=True, check=False, timeout=120
    )
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release matrix's wheels (per-variant, all-wheels, universal) as tiny real wheels, indexed."""
    out = tmp_path_factory.mktemp("wheels")
    for entry in fixture_index()["wheels"] + all_wheel_index()["all_wheels"]:
        build_wheel(out, entry)
    index.write_index(out)
    return out


@pytest.fixture(scope="module")
def http_base(wheels: Path) -> Iterator[str]:
    url, server = serve(wheels)
    yield url
    server.shutdown()


def _machine_here(env: dict[str, Any]) -> bool:
    """A described machine pip's tags here stand for: Linux x86_64 with a glibc no newer than this one."""
    import platform

    glibc = platform.libc_ver()[1]
    return (
        env.get("os") == "linux"
        and env.get("arch") == "x86_64"
        and sys.platform == "linux"
        and platform.machine() == "x86_64"
        and tuple(map(int, str(env.get("glibc") or "0").split("."))) <= tuple(map(int, glibc.split(".")))
    )


def _choices(wheels: Path) -> dict[str, schema.IndexEntry]:
    """Each corpus machine like this one -> the wheel `fa install` picks for it (None: no wheel)."""
    entries = [schema.IndexEntry.from_json(e, "index") for e in _index(wheels)]
    chosen = {}
    for path in sorted(ENVS.glob("*.json")):
        raw = json.loads(path.read_text())["env"]
        if not _machine_here(raw):
            continue
        selection = select(entries, env_from_json(raw), Request())
        if selection.selected is not None:
            chosen[path.stem] = selection.selected
    return chosen


def _index(wheels: Path) -> list[dict[str, Any]]:
    data = json.loads((wheels / "index.json").read_text())
    return list(data["wheels"]) + list(data["all_wheels"])


def _installed(venv_site: Path) -> str:
    """The installed fa-attn as `<version> <tag>`, which names one wheel file."""
    (dist_info,) = venv_site.glob("fa_attn-*.dist-info")
    meta = email.parser.HeaderParser().parsestr((dist_info / "METADATA").read_text())
    wheel = email.parser.HeaderParser().parsestr((dist_info / "WHEEL").read_text())
    return f"{meta['Version']} {wheel['Tag']}"


def _wanted(entry: schema.IndexEntry) -> str:
    return f"{entry.info.version} py3-none-{entry.platform_tag}"


def _fresh_venv(where: Path, tool: str) -> tuple[str, Path]:
    """A new empty venv of this Python, made by the installer's own tool (uv's takes ~20 ms)."""
    if tool == "uv":
        _run([_uv(), "venv", "-q", "--python", sys.executable, str(where)], where.parent)
    else:
        _run([sys.executable, "-m", "venv", "--without-pip", str(where)], where.parent)
    site = next((where / "lib").glob("python3*/site-packages"))
    return str(where / "bin" / "python"), site


def _install(line: str, tool: str, where: Path) -> str:
    """Run a printed pip or uv line into a fresh venv; what it installed."""
    python, site = _fresh_venv(where, tool)
    argv = shlex.split(line)
    if tool == "pip":
        assert argv[:2] == ["pip", "install"], line
        argv = [sys.executable, "-m", "pip", "--python", python, "install", "-q", *argv[2:]]
    else:
        assert argv[:3] == ["uv", "pip", "install"], line
        argv = [_uv(), "pip", "install", "-q", "--python", python, *argv[3:]]
    _run(argv, where.parent)
    return _installed(site)


@pytest.fixture(scope="module")
def choices(wheels: Path) -> dict[str, schema.IndexEntry]:
    found = _choices(wheels)
    assert set(PIP_CASES) <= set(found), sorted(found)
    return found


def test_the_cases_cover_every_kind_of_index(choices: dict[str, schema.IndexEntry]) -> None:
    names = {install_lines.variant_index_name(choices[c]) for c in PIP_CASES}
    assert names == {
        "cu12-torch2.5-cxx11abifalse",
        "cu12-torch2.5-cxx11abitrue",
        "cu11-torch2.5-cxx11abifalse",
        "cu12-torch2.9",
        "cu12",
        "cu13",
        "universal",
    }


@pytest.mark.parametrize("case", PIP_CASES)
def test_pip_from_http_installs_what_fa_install_picks(
    case: str, choices: dict[str, schema.IndexEntry], http_base: str, tmp_path: Path
) -> None:
    lines = install_lines.install_lines(choices[case], http_base)
    assert _install(lines.pip, "pip", tmp_path / "venv") == _wanted(choices[case])


@pytest.mark.parametrize("case", PIP_CASES[::3])
def test_pip_from_file_url_installs_what_fa_install_picks(
    case: str, choices: dict[str, schema.IndexEntry], wheels: Path, tmp_path: Path
) -> None:
    lines = install_lines.install_lines(choices[case], wheels.as_uri())
    assert _install(lines.pip, "pip", tmp_path / "venv") == _wanted(choices[case])


def test_uv_installs_what_fa_install_picks_for_each_wheel_picked(
    choices: dict[str, schema.IndexEntry], wheels: Path, http_base: str, tmp_path: Path
) -> None:
    got, wanted = {}, {}
    distinct = sorted({entry.file: case for case, entry in choices.items()}.values())  # one machine per wheel
    for i, case in enumerate(distinct):
        entry = choices[case]
        # every wheel over HTTP, every third over file:// too (the same code reads both; pip tests both)
        for transport, base in (("http", http_base), ("file", wheels.as_uri()))[: 1 + (i % 3 == 0)]:
            line = install_lines.install_lines(entry, base).uv
            got[case, transport] = _install(line, "uv", tmp_path / f"{case}-{transport}")
            wanted[case, transport] = _wanted(entry)
    assert got == wanted


@pytest.mark.parametrize("case", ["torch29-below-stable-floor", "cpu-only-torch"])
def test_uv_sync_with_the_pyproject_snippet(
    case: str, choices: dict[str, schema.IndexEntry], http_base: str, tmp_path: Path
) -> None:
    lines = install_lines.install_lines(choices[case], http_base)
    project = tmp_path / "app"
    project.mkdir()
    head = '[project]\nname = "app"\nversion = "0"\nrequires-python = ">=3.10"\n'
    (project / "pyproject.toml").write_text(lines.uv_pyproject.replace("[project]\n", head, 1))
    _run([_uv(), "sync", "-q", "--python", sys.executable], project)
    site = next((project / ".venv" / "lib").glob("python3*/site-packages"))
    assert _installed(site) == _wanted(choices[case])


def test_root_index_gives_pip_the_all_wheel_where_fa_install_picks_it(tmp_path: Path) -> None:
    """What PyPI holds (each CPU's all-wheel and the universal wheel): `fa install` picks the all-wheel
    for torch 2.13 on an A100, and the root index gives pip the same file."""
    pypi = tmp_path / "pypi"
    pypi.mkdir()
    for entry in all_wheel_index()["all_wheels"] + all_wheel_index()["wheels"]:
        build_wheel(pypi, entry)
    index.write_index(pypi)
    raw = json.loads((ENVS / "ngc-torch212-stable-abi.json").read_text())["env"]
    entries = [schema.IndexEntry.from_json(e, "index") for e in _index(pypi)]
    chosen = select(entries, env_from_json(raw), Request()).selected
    assert chosen is not None
    assert chosen.info.all_wheel
    lines = install_lines.install_lines(chosen, pypi.as_uri())
    assert lines.index_url == f"{pypi.as_uri()}/simple/"
    assert _install(lines.pip, "pip", tmp_path / "venv") == _wanted(chosen)


def test_a_variant_index_lists_only_its_wheels_and_the_shared_ones(wheels: Path) -> None:
    page = (wheels / "cu12-torch2.9" / "simple" / "fa-attn" / "index.html").read_text()
    listed = sorted(line.split(">")[1].split("<")[0] for line in page.splitlines() if "<a href" in line)
    assert listed == [
        "fa_attn-0.1.0+cu12torch2.9-py3-none-manylinux_2_28_aarch64.whl",
        "fa_attn-0.1.0+cu12torch2.9-py3-none-manylinux_2_28_x86_64.whl",
        "fa_attn-0.1.0-py3-none-any.whl",
        "fa_attn-0.1.0-py3-none-manylinux_2_28_aarch64.whl",
        "fa_attn-0.1.0-py3-none-manylinux_2_28_x86_64.whl",
    ]
