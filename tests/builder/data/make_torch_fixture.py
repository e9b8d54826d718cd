"""Write torch_simple.json: PyPI's simple-API answer for torch, trimmed to what the plan tests need.

Keeps the Linux x86_64 and aarch64 wheels of a few versions (the oldest supported minor, ABI and free-threaded
edges, the newest minor) plus a handful of other files so the tests see what the parser must drop.
Run it by hand to refresh the fixture: python tests/builder/data/make_torch_fixture.py
"""

from __future__ import annotations

import json
from pathlib import Path

from packaging.utils import parse_wheel_filename

from buildtool.builder.pypi import ACCEPT, SIMPLE_URL, simple_json_from_response
from buildtool.core import fetch
from buildtool.core.cpus import linux_cpu

VERSIONS = {
    "2.3.1",
    "2.4.0",
    "2.4.1",
    "2.5.0",
    "2.5.1",
    "2.6.0",
    "2.7.0",
    "2.8.0",
    "2.9.0",
    "2.10.0",
    "2.12.0",
    "2.12.1",
    "2.13.0",
    "2.14.0",
    "2.15.0",
}
# Files the parser must drop: other platforms.
OTHERS = {
    "torch-2.4.0-cp311-none-macosx_11_0_arm64.whl",
    "torch-2.4.0-cp311-cp311-win_amd64.whl",
}


def keep(filename: str) -> bool:
    if filename in OTHERS:
        return True
    try:
        _, version, _, tags = parse_wheel_filename(filename)
    except ValueError:
        return False
    return str(version) in VERSIONS and any(linux_cpu(t.platform) for t in tags)


def main() -> None:
    data = simple_json_from_response(fetch.read_url(SIMPLE_URL, {"Accept": ACCEPT}), SIMPLE_URL)
    files = [f for f in data["files"] if keep(f["filename"])]
    out = {"meta": data.get("meta", {"api-version": "1.0"}), "name": "torch", "files": files}
    path = Path(__file__).with_name("torch_simple.json")
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{path}: {len(files)} files")


if __name__ == "__main__":
    main()
