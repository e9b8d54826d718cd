"""The index page's picker (compat/picker.py) against choose.select itself: the memo changes no answer,
and each reduced axis holds what it claims (Pythons of one group, drivers of one range, GPUs of one
family answer alike), over the repo matrix's wheels (fixture_index: per-variant, all-wheels, universal)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from buildtool.compat import picker
from buildtool.compat.choose import Memo, Selection, select
from buildtool.compat.env import Gpu
from buildtool.core.runtime import schema, versions
from tests.select.fixture_index import all_wheel_index, fixture_index


@pytest.fixture(scope="module")
def entries() -> tuple[schema.IndexEntry, ...]:
    data = fixture_index()
    data["all_wheels"] = all_wheel_index()["all_wheels"]
    return schema.read_index(data)


@pytest.fixture(scope="module")
def machines(entries) -> list[picker.Machine]:
    return list(picker.machines(entries))


def _outcome(selection: Selection) -> tuple[Any, ...]:
    """What a person acts on: the verdict, the wheel, the path and the reason codes (not the numbers)."""
    return (
        selection.verdict,
        selection.selected.file if selection.selected else None,
        selection.runtime.path,
        selection.codes,
    )


def test_every_machine_is_answered_once(machines):
    keys = [m.key for m in machines]
    assert len(keys) == len(set(keys))
    assert len(keys) > 1000


def test_the_memo_changes_no_answer(entries, machines):
    memo = Memo()
    kept = {m.key: select(entries, m.env, memo=memo) for m in machines}
    for machine in machines[::23]:
        assert kept[machine.key] == select(entries, machine.env), machine.key


def test_pythons_of_a_group_answer_alike(entries, machines):
    groups = picker.python_groups(entries, [p.base("2.28") for p in picker.platforms(entries)])
    for machine in machines[::97]:
        members = [p for p, g in groups.items() if g == groups[machine.env.python]]
        answers = {select(entries, dataclasses.replace(machine.env, python=p)) for p in members}
        assert len(answers) == 1, machine.key


def test_a_driver_range_answers_as_its_lowest_driver(entries, machines):
    floors = sorted({m.env.driver for m in machines if m.env.driver is not None}, key=versions.parse_driver)
    for machine in machines[::31]:
        driver = machine.env.driver
        if driver is None:
            continue
        i = floors.index(driver)
        upper = floors[i + 1] if i + 1 < len(floors) else "999.0"
        major = versions.parse_driver(driver)[0]
        inside = [
            d
            for d in (f"{major}.99.99", f"{major + 1}.0")
            if versions.parse_driver(d) < versions.parse_driver(upper)
        ]
        for other in inside:
            moved = dataclasses.replace(machine.env, driver=other)
            assert _outcome(select(entries, moved)) == _outcome(select(entries, machine.env)), (
                machine.key,
                other,
            )


@pytest.mark.parametrize(
    ("member", "family"), [("10.3", "10.0"), ("12.1", "12.0"), ("6.1", "7.0"), ("6.0", "7.0")]
)
def test_a_gpu_family_answers_alike(entries, machines, member, family):
    for machine in machines[::41]:
        if not machine.env.gpus or machine.env.gpus[0].sm != family:
            continue
        moved = dataclasses.replace(machine.env, gpus=(Gpu("member", member, None),))
        assert _outcome(select(entries, moved)) == _outcome(select(entries, machine.env)), machine.key


def test_torch_builds_are_the_per_variant_wheels_pairs(entries):
    """The all-wheel pairs every binding with every CUDA major; the picker offers only the (torch,
    CUDA) pairs per-variant wheels are built for (no torch 2.13 with CUDA 11, no 2.4 with CUDA 13)."""
    builds = picker.torch_builds(entries, "x86_64")
    assert 11 not in builds["2.13"]
    assert 13 not in builds["2.4"]
    alone = [e for e in entries if e.info.all_wheel or e.info.universal]
    assert 13 in picker.torch_builds(alone, "x86_64")["2.4"]  # with nothing else, the all-wheel speaks
