"""The all-wheel end to end on the fixture kernels with the torch installed here: `fa build --local`
makes it from the per-variant wheels' own compiles (nothing compiled for it), real pip and real uv
install it offline from a plain --find-links folder holding only it, and in each venv the runtime
picks its binding for this torch, loads it, registers the ops, and picks each call's kernel set by
GPU and driver (a described GPU: this machine has none). bench/build/all_wheel_proof.py does the same
across torch 2.4 to 2.15 from PyPI and for aarch64 under qemu-user."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.builder.conftest import fa_command
from tests.nested_venv import make_venv, uv_binary

pytestmark = [pytest.mark.slow, pytest.mark.network]  # the pinned NVRTC wheels of CUDA 11 and 12

MATRIX = """\
version: "0.1.0"
torch: ["2.13"]
cuda: [11, 12]
python: ["3.11"]
archs: {"11": ["8.0"], "12": ["8.0", "9.0"]}
all_wheel: true
"""

# Run inside each venv: the installed all-wheel, its binding for this torch, and per-call choices.
CHECK = textwrap.dedent("""
    import json, torch
    from pathlib import Path
    from fa_attn import all_wheel, loader
    from fa_attn.decision import Call, Device
    man = loader.manifest()
    problem = loader.load_binding()
    binding = all_wheel.binding_for(man.info, torch.__version__, bool(torch._C._GLIBCXX_USE_CXX11_ABI))

    def pick(sm, driver, torch_cuda):
        answer, view = all_wheel.decide_call(
            man.info, binding, Device("cuda", sm, None, driver), Call("fp16", 64), torch_cuda,
            man.kernels, loader.PACKAGE_DIR, lambda: None)
        fwd = answer.fwd.module if answer.fwd else None
        return [answer.path, answer.arch, view.cuda_major, fwd and Path(fwd).is_file(),
                [r.code for r in answer.reasons]]

    print(json.dumps({
        "variant": man.info.variant,
        "where": str(loader.PACKAGE_DIR),
        "load": None if problem is None else f"{problem.code}: {problem.message}",
        "ops": float(torch.ops.fa_fixture.params_size(torch.zeros(1))[0]),
        "binding": binding.file,
        "a100_driver_520_torch_cu118": pick("8.0", "520.61.05", 11),
        "a100_driver_550_torch_cu126": pick("8.0", "550.54.15", 12),
        "h100_driver_520": pick("9.0", "520.61.05", 11),
        "h100_driver_550_torch_cu118": pick("9.0", "550.54.15", 11),
        "h100_driver_440": pick("9.0", "440.33.01", 11),
    }))
""")


def run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # Without the caller's PYTHONPATH: a checkout's kernels/ on it (a developer's setup) would shadow the
    # installed all-wheel's fa_attn, and the venv would test the checkout instead of the wheel.
    outer = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        cmd, cwd=cwd, env={**outer, **env}, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, fixture_tree: Path, build_cache: Path) -> dict:
    del build_cache  # this session's FA_CACHE (conftest), set for the build
    work = tmp_path_factory.mktemp("all-wheel")
    (work / "matrix.yaml").write_text(MATRIX)
    out = work / "wheels"
    cmd = fa_command(
        "build", "--local", "--cuda", "11", "--cuda", "12", "--out", str(out), "--json", "-j", "2"
    )
    summary = json.loads(run(cmd, work, FA_KERNELS_DIR=str(fixture_tree)).stdout)
    return {"work": work, "out": out, "summary": summary}


def test_the_all_wheel_is_made_of_the_other_wheels_work(built: dict) -> None:
    rows = {w["variant"]: w for w in built["summary"]["wheels"]}
    assert set(rows) == {"cu11torch2.13", "cu12torch2.13", "all"}
    whole = rows["all"]
    assert whole["file"] == f"fa_attn-0.1.0-py3-none-{whole['platform_tag']}.whl"
    assert (whole["compiled"], whole["compile_seconds"]) == (0, 0.0)
    with zipfile.ZipFile(built["out"] / whole["file"]) as zf:
        man = json.loads(zf.read("fa_attn/manifest.json"))
        names = set(zf.namelist())
    assert (man["variant"], man["cuda_major"], man["schema_minor"]) == ("all", None, 4)  # 1.4: tiles
    sets = {k["cuda_major"]: (k["sass"], k["ptx"]) for k in man["kernel_sets"]}
    # CUDA 11 is older than the main major (12): its SASS, no PTX; CUDA 12 ships its PTX.
    assert sets == {11: (["8.0"], None), 12: (["8.0", "9.0"], "9.0")}
    assert [b["file"] for b in man["bindings"]] == ["bindings/libfa_attn_ops-torch2.13.so"]
    assert {f"fa_attn/{k['file']}" for k in man["kernels"]} <= names
    assert "fa_attn/bindings/libfa_attn_ops-torch2.13.so" in names
    index = json.loads((built["out"] / "index.json").read_text())
    # under its own key, which a reader older than schema 1.3 ignores
    assert [w["variant"] for w in index["all_wheels"]] == ["all"]
    assert all(w["variant"] != "all" for w in index["wheels"])


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_pip_and_uv_install_it_from_a_folder_holding_only_it(built: dict, installer: str) -> None:
    work: Path = built["work"]
    only = work / f"only-{installer}"
    only.mkdir()
    whole = next(w["file"] for w in built["summary"]["wheels"] if w["variant"] == "all")
    shutil.copy(built["out"] / whole, only)
    venv = work / f"venv-{installer}"
    # The venv sees the torch 2.13 these tests run with (tests/nested_venv.py); fa-attn goes into it.
    py = str(make_venv(venv, tool="venv" if installer == "pip" else "uv"))
    if installer == "pip":
        run([py, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(only), "fa-attn"], work)
    else:
        run(
            [
                uv_binary(),
                "pip",
                "install",
                "-q",
                "--python",
                py,
                "--offline",
                "--no-index",
                "--find-links",
                str(only),
                "fa-attn",
            ],
            work,
        )
    if installer == "pip":  # and `fa install` takes it too, as the only wheel there
        chosen = json.loads(
            run([*fa_command("install", "--wheels", str(only), "--dry-run", "--json")], work).stdout
        )
        assert (chosen["selected"], chosen["variant"]) == (whole, "all")
    facts = json.loads(run([py, "-c", CHECK], work, PYTHONWARNINGS="ignore").stdout.splitlines()[-1])
    assert facts["where"].startswith(str(venv))
    # The fixture binding registers fa_fixture::params_size (CPU), not fa_attn's ops: the loader
    # loaded it (the op runs) and says it has no fa_attn::fwd, as it says of any such binding.
    assert facts["variant"] == "all"
    assert facts["load"].endswith("loaded but registered no CUDA kernel for fa_attn::fwd")
    assert facts["ops"] > 0
    assert facts["binding"] == "bindings/libfa_attn_ops-torch2.13.so"
    # Per call: torch's CUDA major first, each driver's own set, and a driver below every floor.
    assert facts["a100_driver_520_torch_cu118"] == ["sass", "8.0", 11, True, []]
    assert facts["a100_driver_550_torch_cu126"] == ["sass", "8.0", 12, True, []]
    # sm 9.0 on driver 520: only CUDA 11 runs there, and it has no sm 9.0 SASS (8.0's is another major)
    assert facts["h100_driver_520"] == ["fallback", None, 11, None, ["arch-unsupported"]]
    # on driver 550 CUDA 12's sm 9.0 SASS wins over torch's own major (11), which would fall back
    assert facts["h100_driver_550_torch_cu118"] == ["sass", "9.0", 12, True, []]
    assert facts["h100_driver_440"][0] == "fallback"
    assert facts["h100_driver_440"][4] == ["driver-too-old"]
