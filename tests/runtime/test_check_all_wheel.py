"""`fa check` with the all-wheel (what `pip install fa-attn` gives): it checks the units the runtime would
use on the GPU, picked by the runtime's own code (dispatch.decide, the all-wheel's choice of kernel set
by GPU and driver), and a check that would run no unit is verdict no-units and exit 1 with the reason,
never a pass of nothing. The manifests are the build's own (buildtool/builder/all_wheel.py); the GPU is
described (this machine has none)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fa_attn.runtime import dispatch
from fa_attn.runtime.decision import Call, Device
from fa_attn.runtime.loader import UNIVERSAL_MANIFEST
from fa_attn.verify import check

from tests.runtime.test_all_wheel_runtime import manifest

A100 = Device("cuda", "8.0", 167936)
PKG = Path("/pkg")


@pytest.mark.parametrize(("driver", "major"), [("550.54.15", 12), ("520.61.05", 11)])
def test_the_all_wheel_checks_the_kernel_set_the_runtime_serves(driver: str, major: int) -> None:
    man = manifest()
    jobs, why = check.jobs_on(A100, 0, man, lambda: driver, PKG)
    assert why == []
    assert jobs, "the runtime serves this GPU from the all-wheel: the check must check something"
    assert {j.module.split("/")[3] for j in jobs} == {f"cu{major}"}
    assert {j.direction for j in jobs} == {"fwd", "bwd", "splitkv"}
    # exactly the units the runtime launches for each call the wheel's kernels serve
    served = set()
    for kernel in man.kernels:
        call = Call(kernel.dtype, kernel.head_dim, backward=kernel.direction == "bwd")
        route = dispatch.decide(dispatch.CallFacts(A100, call), man, lambda: None, lambda: driver, PKG)
        served |= {x.module for x in (route.fwd, route.bwd, route.splitkv) if x is not None}
    assert {j.module for j in jobs} == served
    assert all(f"/kernels/cu{major}/sm_80/" in j.module for j in jobs)


def test_a_driver_below_every_set_checks_nothing_and_says_why() -> None:
    jobs, why = check.jobs_on(A100, 0, manifest(), lambda: "440.33.01", PKG)
    assert jobs == []
    assert [r.code for r in why] == ["driver-too-old"]
    report = check.nothing_to_check(why)
    assert (report.verdict, report.exit_code) == ("no-units", 1)
    assert "driver-too-old" in report.fix
    assert report.to_json()["verdict"] == "no-units"


def test_no_kernels_is_no_units_with_the_fix() -> None:
    jobs, why = check.jobs_on(A100, 0, UNIVERSAL_MANIFEST, lambda: None, PKG)
    assert jobs == []
    report = check.nothing_to_check(why)
    assert report.exit_code == 1
    lines: list[str] = []
    check.render(report, lines.append)
    text = "\n".join(lines)
    assert "verdict no-units" in text
    assert "fa install" in text
    assert max(len(line) for line in lines) <= 80
