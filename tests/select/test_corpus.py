"""Every environment in tests/select/envs/ (written from real reports; each names its source) gets the
expected verdict, wheel and codes against an index shaped like `fa build`'s output for matrix.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildtool.compat.choose import Request, select
from buildtool.compat.env import env_from_json
from buildtool.compat.wheel_index import entry_from_dict
from tests.select.fixture_index import fixture_index

ENVS = Path(__file__).parent / "envs"
CASES = sorted(ENVS.glob("*.json"))


@pytest.fixture(scope="module")
def entries():
    index = fixture_index()
    return [entry_from_dict(w, f"fixture wheels[{i}]") for i, w in enumerate(index["wheels"])]


def test_corpus_is_large_enough():
    assert len(CASES) >= 25


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case(path: Path, entries):
    case = json.loads(path.read_text())
    assert case.get("source"), f"{path.name}: write where the case comes from"
    env = env_from_json(case["env"])
    wanted = case.get("index", {}).get("cuda_major")
    cpus = case.get("index", {}).get("platform")
    offered = [e for e in entries if wanted is None or e.info.cuda_major in wanted or e.info.universal]
    offered = [e for e in offered if cpus is None or e.info.platform in cpus or e.info.universal]
    selection = select(offered, env, Request(**case.get("request", {})))
    got = {
        "verdict": selection.verdict,
        "selected_variant": None if selection.selected is None else selection.selected.info.variant,
        "codes": list(selection.codes),
    }
    assert got == case["expect"]
    # Every wheel that does not fit says why; every fallback carries a reason.
    assert all(w.fits or w.reasons for w in selection.wheels)
    if selection.verdict in ("fallback", "no-wheel"):
        assert selection.codes


def test_newest_version_wins_a_tie():
    from tests.select.fixture_index import kernel_entry

    old, new = kernel_entry(12, "2.5", False), kernel_entry(12, "2.5", False)
    for key in ("file", "version"):
        new[key] = new[key].replace("0.1.0", "0.10.0")  # numerically newer, textually smaller
    env = env_from_json(json.loads((ENVS / "aws-a10g-pypi-torch.json").read_text())["env"])
    wheels = [entry_from_dict(old, "old"), entry_from_dict(new, "new")]
    assert select(wheels, env).selected.info.version == "0.10.0+cu12torch2.5cxx11abifalse"
