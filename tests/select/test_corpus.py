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


# -- stable-ABI wheels beside per-minor ones ---------------------------------------------------------


def _h100(torch: str) -> dict:
    case = json.loads((ENVS / "torch-nightly-stable-abi.json").read_text())["env"]
    return {**case, "torch": {**case["torch"], "version": torch}}


def test_stable_wheel_wins_a_tie_with_the_per_minor_wheel_and_says_why():
    from tests.select.fixture_index import kernel_entry

    per_minor = entry_from_dict(kernel_entry(13, "2.13", True), "per-minor")
    stable = entry_from_dict(kernel_entry(13, "2.10", None, tested=("2.10", "2.13")), "stable")
    selection = select([per_minor, stable], env_from_json(_h100("2.13.1+cu130")))
    assert selection.selected is stable and selection.warnings == ()
    assert "keeps working when torch is upgraded" in selection.why and stable.file in selection.why


def test_a_per_minor_wheel_tested_with_this_torch_beats_an_untested_stable_one():
    from tests.select.fixture_index import kernel_entry

    per_minor = entry_from_dict(kernel_entry(13, "2.16", True), "per-minor")
    stable = entry_from_dict(kernel_entry(13, "2.10", None, tested=("2.10", "2.15")), "stable")
    env = env_from_json(_h100("2.16.0+cu130"))
    selection = select([stable, per_minor], env)
    assert selection.selected is per_minor and "only up to torch 2.15" in selection.why
    alone = select([stable], env)  # no per-minor wheel: the stable one, with the warning, not a refusal
    assert alone.selected is stable and alone.verdict == "ok"
    (warning,) = alone.warnings
    assert warning.code == "torch-newer-than-tested" and "2.10, 2.15" in warning.message


def test_below_the_floor_the_stable_wheel_says_so():
    from tests.select.fixture_index import kernel_entry

    stable = entry_from_dict(kernel_entry(12, "2.10", None), "stable")
    selection = select([stable], env_from_json(_h100("2.9.1+cu128")))
    assert selection.verdict == "no-wheel" and selection.codes == ("torch-below-floor",)
    assert "fa install --build" in selection.deciding[0].fix
