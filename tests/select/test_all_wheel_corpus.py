"""`fa doctor` with only the all-wheel (and the universal wheel, which PyPI holds beside it for other
platforms) answers every environment of the corpus as with the per-variant wheels: the same verdict,
runtime path and arch, deciding codes and runtime reasons. The exceptions are the cases where the
per-variant wheels offered cannot serve and the all-wheel can; each is listed with why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildtool.compat.choose import Request, Selection, select
from buildtool.compat.env import env_from_json
from buildtool.compat.wheel_index import entry_from_dict
from tests.select.fixture_index import all_wheel_index

ENVS = Path(__file__).parent / "envs"
CASES = sorted(ENVS.glob("*.json"))

# stem -> why the all-wheel answers differently (the per-variant index of the case cannot serve).
DIFFERENT = {
    "driver470-cu12-wheels-only": (
        "the case's index holds cu12 wheels only, which driver 470 cannot run (driver-too-old); the "
        "all-wheel installs and would run its cu11 kernels, but torch's own CUDA 12.8 needs a newer "
        "driver, so calls still fall back: the same verdict, without driver-too-old"
    ),
}


@pytest.fixture(scope="module")
def tagged(index_data: dict):
    return [entry_from_dict(w, f"tagged[{i}]") for i, w in enumerate(index_data["wheels"])]


@pytest.fixture(scope="module")
def alls():
    data = all_wheel_index()
    return [entry_from_dict(w, f"all[{i}]") for i, w in enumerate(data["all_wheels"] + data["wheels"])]


def answer(sel: Selection) -> dict:
    return {
        "verdict": sel.verdict,
        "path": sel.runtime.path,
        "arch": sel.runtime.arch,
        "codes": list(sel.codes),
        "runtime_reasons": [r.code for r in sel.runtime.reasons],
        "gpus": [(a.runtime.path, a.runtime.arch) for a in sel.gpus],
    }


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_the_all_wheel_answers_as_the_tagged_wheels(path: Path, tagged, alls):
    case = json.loads(path.read_text())
    env = env_from_json(case["env"])
    request = Request(**case.get("request", {}))
    cpus = case.get("index", {}).get("platform")
    majors = case.get("index", {}).get("cuda_major")

    def on_cpus(entries):
        return [e for e in entries if cpus is None or e.info.universal or e.info.platform in cpus]

    offered = [
        e for e in on_cpus(tagged) if majors is None or e.info.universal or e.info.cuda_major in majors
    ]
    with_tagged, with_all = select(offered, env, request), select(on_cpus(alls), env, request)
    if env.os == "windows":  # the all-wheel is Linux's; Windows gets win_amd64 per-variant wheels only
        assert with_all.selected is None or with_all.selected.info.universal
        return
    if path.stem in DIFFERENT:
        assert answer(with_all) != answer(with_tagged), (
            f"{path.stem} no longer differs: drop it from DIFFERENT"
        )
        assert with_all.verdict == with_tagged.verdict
        return
    assert answer(with_all) == answer(with_tagged)
    if with_tagged.selected is not None and not with_tagged.selected.info.universal:
        assert with_all.selected is not None
        assert with_all.selected.info.variant == "all"


def test_the_all_wheel_serves_where_the_offered_tagged_wheels_cannot(tagged, alls):
    """torch 2.5+cu118 on driver 520 with only cu12 wheels offered: none runs (driver-too-old); the
    all-wheel runs its cu11 SASS."""
    case = json.loads((ENVS / "driver520-torch-cu118.json").read_text())
    env = env_from_json(case["env"])
    cu12 = [e for e in tagged if e.info.universal or e.info.cuda_major == 12]
    assert select(cu12, env).verdict == "fallback"
    assert "driver-too-old" in select(cu12, env).codes
    chosen = select(alls, env)
    assert (chosen.verdict, chosen.runtime.path, chosen.runtime.arch) == ("ok", "sass", "8.0")


def test_install_prefers_the_slimmer_wheel_and_keeps_the_all_wheel_as_fallback(tagged, alls):
    case = json.loads((ENVS / "aws-a10g-pypi-torch.json").read_text())
    env = env_from_json(case["env"])
    both = select(tagged + alls, env)
    assert both.selected is not None
    assert both.selected.info.variant == case["expect"]["selected_variant"]
    all_x86 = next(e for e in alls if e.info.variant == "all" and e.info.platform == "x86_64")
    pair = select([all_x86, both.selected], env)
    assert pair.selected is both.selected
    assert "slimmer" in pair.why
    only_all = select(alls, env)
    assert only_all.selected is not None
    assert only_all.selected.info.variant == "all"


def test_fa_doctor_says_what_the_all_wheel_acts_as(tmp_path: Path):
    """The CLI with an index holding only the all-wheels and the universal wheel: torch 2.5+cu118 (old
    C++ ABI) on driver 520 gets the torch 2.5 old-ABI binding and CUDA 11's kernels."""
    from typer.testing import CliRunner

    from buildtool.cli import app

    (tmp_path / "index.json").write_text(json.dumps(all_wheel_index()))
    env = tmp_path / "env.json"
    env.write_text(json.dumps(json.loads((ENVS / "driver520-torch-cu118.json").read_text())["env"]))
    args = ["doctor", "--env", str(env), "--wheels", str(tmp_path)]
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)  # stderr: the first line
    assert (data["verdict"], data["variant"]) == ("ok", "all")
    binding = "bindings/libfa_attn_ops-torch2.5cxx11abifalse.so"
    assert data["acts_as"] == {"binding": binding, "cuda_major": 11}
    text = CliRunner().invoke(app, args, env={"COLUMNS": "80"}).output
    assert "it acts here as: binding torch2.5cxx11abifalse, CUDA 11 kernels" in text
