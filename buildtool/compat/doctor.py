"""`fa doctor`'s report: probe + rules + select, as JSON for scripts and as rich tables for people."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.text import Text

from buildtool.compat import index_fixes, verified
from buildtool.compat.choose import (
    DTYPES,
    VERDICTS,
    Dispatch,
    Memo,
    Reason,
    Request,
    Selection,
    WheelFit,
    runtime_for,
    select,
)
from buildtool.compat.env import Env, env_to_json
from buildtool.compat.fit import as_installed
from buildtool.compat.wheel_index import WheelIndex, base_url, missing_pages
from buildtool.core import install_lines
from buildtool.core.cpus import canonical, windows_cpu
from buildtool.core.runtime import reasons, schema
from buildtool.errors import EXIT_FAILED, EXIT_OK

# Our kernels run (SASS or PTX): 0; calls fall back, or nothing installs: 1.
EXIT_CODES = {"ok": EXIT_OK, "ok-jit": EXIT_OK, "fallback": EXIT_FAILED, "no-wheel": EXIT_FAILED}

_VERDICT_STYLE = {
    "ok": "bold green",
    "ok-jit": "bold green",
    "fallback": "bold yellow",
    "no-wheel": "bold red",
}
VERDICT_TEXT = {
    "ok": "our kernels run from SASS on this GPU",
    "ok-jit": "our kernels run, JIT-compiled from PTX on first use",
    "fallback": "a wheel installs, but calls fall back to torch SDPA",
    "no-wheel": "no wheel can be installed here",
}


# The dtypes doctor answers for when the call's dtype is not given: the two fa's kernels run.
BOTH_DTYPES = ("fp16", "bf16")


@dataclass(frozen=True)
class DtypeAnswer:
    """What the chosen wheel does for calls of one dtype: GPU 0's verdict and its reasons, and each GPU's
    answer (none without a GPU)."""

    dtype: str
    verdict: str
    deciding: tuple[Reason, ...]
    runtime: Dispatch  # GPU 0's (or the machine's without a GPU)
    gpus: tuple[Dispatch, ...]


@dataclass(frozen=True)
class DoctorReport:
    env: Env
    request: Request
    index_location: str
    selection: Selection
    # pip and uv lines for the chosen wheel, from its per-variant index (None: nothing to install)
    install: install_lines.InstallLines | None = None
    # a local folder without the index pages the lines name: run `fa index` there first
    missing_page: str | None = None
    # the answer per dtype asked about (fp16 and bf16 when --dtype is not given), the deciding one first
    dtypes: tuple[DtypeAnswer, ...] = ()

    @property
    def answer(self) -> DtypeAnswer:
        """The dtype whose answer is the verdict: the best of those asked (bf16, fa install's, on a tie)."""
        return self.dtypes[0]


def by_dtype(
    entries: Sequence[schema.IndexEntry],
    env: Env,
    selection: Selection,
    request: Request,
    dtypes: Sequence[str],
    facts: index_fixes.IndexFacts,
    memo: Memo | None = None,
) -> tuple[DtypeAnswer, ...]:
    """The chosen wheel's answer for each dtype, best verdict first. `selection` is fa install's choice
    (made for request.dtype). With a kernel wheel chosen, another dtype's answer is what the runtime does
    with it (choose.runtime_for, as select decides it); with the universal wheel or nothing, select is
    asked again for that dtype, whose reasons name what a kernel wheel would do on the GPU."""
    chosen = selection.selected
    found = []
    for dtype in dtypes:
        asked = dataclasses.replace(request, dtype=dtype)
        if dtype == request.dtype:
            verdict, deciding, runtime = selection.verdict, selection.deciding, selection.runtime
            gpus = tuple(a.runtime for a in selection.gpus)
        elif chosen is None or chosen.info.universal:
            again = select(entries, env, asked, memo)
            verdict, deciding, runtime = again.verdict, again.deciding, again.runtime
            gpus = tuple(runtime_for(chosen, env, g, asked, selection.stack, memo) for g in env.gpus)
        else:
            gpus = tuple(runtime_for(chosen, env, g, asked, selection.stack, memo) for g in env.gpus)
            runtime = gpus[0] if gpus else runtime_for(chosen, env, None, asked, selection.stack, memo)
            verdict = {"sass": "ok", "ptx": "ok-jit"}.get(runtime.path, "fallback")
            deciding = runtime.reasons if verdict == "fallback" else ()
        found.append(
            DtypeAnswer(
                dtype,
                verdict,
                index_fixes.refine_all(deciding, env, chosen, facts),
                _refined(runtime, env, chosen, facts),
                tuple(_refined(g, env, chosen, facts) for g in gpus),
            )
        )
    # The best verdict decides; on a tie the dtype fa install chose for (request.dtype) goes first.
    found.sort(key=lambda a: (VERDICTS.index(a.verdict), a.dtype != request.dtype))
    return tuple(found)


def _refined(
    runtime: Dispatch, env: Env, chosen: schema.IndexEntry | None, facts: index_fixes.IndexFacts
) -> Dispatch:
    fixed = index_fixes.refine_all(runtime.reasons, env, chosen, facts)
    return runtime if fixed == runtime.reasons else dataclasses.replace(runtime, reasons=fixed)


def build_report(
    env: Env,
    index: WheelIndex,
    request: Request,
    dtypes: Sequence[str] | None = None,
    matrix_platforms: Sequence[str] | None = None,
) -> DoctorReport:
    """Doctor's answer for `env`: fa install's choice (made for `request`) and what it does for each of
    `dtypes` (default: request.dtype alone). `matrix_platforms`: the platforms of the matrix the wheel
    folder was built from, when known (a fix may name the build's --platform)."""
    facts = index_fixes.IndexFacts.of(index.entries, matrix_platforms)
    selection = select(index.entries, env, request)
    answers = by_dtype(index.entries, env, selection, request, dtypes or (request.dtype,), facts)
    chosen = selection.selected
    wheels = tuple(
        dataclasses.replace(w, reasons=index_fixes.refine_all(w.reasons, env, chosen, facts))
        for w in selection.wheels
    )
    selection = dataclasses.replace(selection, wheels=wheels)
    lines = missing = None
    if chosen is not None:
        lines = install_lines.install_lines(chosen, base_url(index))
        page = missing_pages(index, install_lines.index_path(lines.index_name))
        missing = None if page is None else str(page)
    return DoctorReport(
        env=env,
        request=request,
        index_location=index.location,
        selection=selection,
        install=lines,
        missing_page=missing,
        dtypes=answers,
    )


def _install_json(report: DoctorReport) -> dict[str, Any] | None:
    lines = report.install
    if lines is None:
        return None
    return {
        "index": lines.index_name,
        "index_url": lines.index_url,
        "requirement": lines.requirement,
        "pip": lines.pip,
        "uv": lines.uv,
        "requirements_txt": lines.requirements_txt,
        "uv_pyproject": lines.uv_pyproject,
        "missing_page": report.missing_page,
    }


def _acts_as_json(entry: schema.IndexEntry | None, env: Env) -> dict[str, Any] | None:
    if entry is None or not entry.info.all_wheel:
        return None
    view = as_installed(entry.info, env)
    return {"binding": view.binding, "cuda_major": view.cuda_major}


def _reasons_json(reasons: Sequence[Reason]) -> list[dict[str, str]]:
    return [{"code": r.code, "message": r.message, "fix": r.fix} for r in reasons]


def _runtime_json(runtime: Dispatch) -> dict[str, Any]:
    return {
        "path": runtime.path,
        "arch": runtime.arch,
        "head_dim": runtime.head_dim,
        "reasons": _reasons_json(runtime.reasons),
        # why a better (arch-specific, sm_90a) image does not run the call: [] when none was passed over
        "passed_over": _reasons_json(runtime.passed_over),
        # an arch-specific path's next one: what runs until its first-use check passed (null otherwise)
        "then": None if runtime.then is None else _runtime_json(runtime.then),
        "tiles": dict(runtime.tiles),  # direction -> the tile the GPU's shared memory chose
        "notes": _reasons_json(runtime.notes),
    }


def report_json(report: DoctorReport) -> dict[str, Any]:
    sel, answer = report.selection, report.answer
    return {
        "verdict": answer.verdict,
        # the dtype whose answer is the verdict (the best of those asked; `dtypes` has each)
        "dtype": answer.dtype,
        "selected": sel.selected.file if sel.selected else None,
        "variant": sel.selected.info.variant if sel.selected else None,
        # the all-wheel: the binding and CUDA major it uses here (null for any other wheel)
        "acts_as": _acts_as_json(sel.selected, report.env),
        "codes": [r.code for r in answer.deciding],
        "because": _reasons_json(answer.deciding),
        "why": sel.why,
        "warnings": _reasons_json(sel.warnings),
        "runtime": _runtime_json(answer.runtime),
        "dtypes": [
            {
                "dtype": a.dtype,
                "verdict": a.verdict,
                "codes": [r.code for r in a.deciding],
                "because": _reasons_json(a.deciding),
                "runtime": _runtime_json(a.runtime),
            }
            for a in report.dtypes
        ],
        "gpus": [
            {
                "index": g.index,
                "name": g.gpu.name,
                "sm": g.gpu.sm,
                "runtime": _runtime_json(answer.gpus[i]),
                "dtypes": {a.dtype: _runtime_json(a.gpus[i]) for a in report.dtypes},
                "explain": explain(answer.gpus[i], g.gpu.sm),  # another arch's image serving it, or ""
                "check": verified.summary(verified.machine(report.env, g.gpu)),
            }
            for i, g in enumerate(sel.gpus)
        ],
        "stack": _reasons_json(sel.stack),
        "wheels": [
            {
                "file": w.entry.file,
                "variant": w.entry.info.variant,
                "platform": w.entry.info.platform,
                "fits": w.fits,
                "reasons": _reasons_json(w.reasons),
            }
            for w in sel.wheels
        ],
        "request": {
            "dtype": answer.dtype,
            "dtypes": [a.dtype for a in report.dtypes],
            "head_dim": report.request.head_dim,
            "backward": report.request.backward,
        },
        "env": env_to_json(report.env),
        "index": report.index_location,
        # pip and uv lines for the selected wheel (null when nothing is selected)
        "install": _install_json(report),
    }


def _env_line(env: Env) -> str:
    torch = (
        "none"
        if env.torch is None
        else (
            f"{env.torch.version} (cuda {env.torch.cuda or '-'}, hip {env.torch.hip or '-'}, "
            f"cxx11abi {'?' if env.torch.cxx11abi is None else str(env.torch.cxx11abi).lower()})"
        )
    )
    gpus = ", ".join(f"{i}: {g.name} (sm {g.sm})" for i, g in enumerate(env.gpus)) or "none"
    glibc = f" glibc {env.glibc}" if env.glibc else ""
    return (
        f"{env.os} {env.arch}{glibc}, Python {env.python}\ntorch {torch}\n"
        f"driver {env.driver or 'none'}; GPUs {gpus}"
    )


def runtime_line(runtime: Dispatch) -> str:
    if runtime.then is not None:  # arch-specific (sm_90a): only once checked, the next path before
        return f"SASS for sm {runtime.arch} once checked, else {_image_line(runtime.then)}"
    return _image_line(runtime)


def _image_line(runtime: Dispatch) -> str:
    tiles = "".join(f", {direction} tile {tile}" for direction, tile in runtime.tiles)
    if runtime.path == "sass":
        return f"SASS for sm {runtime.arch}, head dim {runtime.head_dim}{tiles}"
    if runtime.path == "ptx":
        return f"PTX for compute {runtime.arch} (JIT), head dim {runtime.head_dim}{tiles}"
    return "fallback to torch SDPA"


def explain(runtime: Dispatch, sm: str) -> str:
    """Why an image of another arch serves this GPU (B300/GB300's 10.3 on 10.0's SASS, DGX Spark's 12.1
    on 12.0's), or "" when the image is the GPU's own or nothing runs (the reasons say why)."""
    if runtime.then is not None:
        return (
            f"sm {runtime.arch} is the arch-specific forward (wgmma, TMA) for compute capability {sm} "
            "only: a kind of call runs it once its first-use check (or `fa check`) passed here; not "
            "verified on a GPU"
        )
    if runtime.arch is None or runtime.arch == sm or runtime.path == "fallback":
        return ""
    if runtime.path == "sass":
        return (
            f"sm {sm} runs sm {runtime.arch}'s SASS (same major, lower minor: NVIDIA's compatibility rule, "
            f"not verified on a GPU here); fa builds no sm {sm} SASS of its own (matrix.yaml says why)"
        )
    return (
        f"no SASS of sm {sm}'s major here: the driver JIT-compiles compute {runtime.arch}'s PTX for sm {sm} "
        "on first use (PTX runs on an equal or newer arch)"
    )


def acts_as(entry: schema.IndexEntry, env: Env) -> str:
    """What the all-wheel loads here: the binding for the torch installed and the CUDA major whose
    kernels this driver and torch prefer (per call the GPU may take another: the GPU lines say)."""
    view = as_installed(entry.info, env)
    label = (view.binding or "").rsplit("/", 1)[-1].removesuffix(".so").split("-", 1)[-1]
    return f"binding {label}, CUDA {view.cuda_major} kernels"


def readable_why(selection: Selection) -> str:
    """`why` with the wheels named as people tell them apart (wheel_name), not by file name."""
    why = selection.why
    for w in selection.wheels:
        if w.entry.file in why:
            why = why.replace(w.entry.file, wheel_name(w.entry))
    return why


def wheel_name(entry: schema.IndexEntry) -> str:
    """A wheel as people tell them apart: its variant and CPU ("cu12torch2.8 x86_64", "universal");
    the file name is in --json."""
    if entry.info.universal:
        return "universal"
    if windows_cpu(entry.platform_tag or "") is not None:  # the same variant and CPU as a Linux wheel
        return f"{entry.info.variant} {entry.platform_tag}"
    return f"{entry.info.variant} {entry.info.platform}"


def _groups(wheels: Sequence[WheelFit]) -> list[list[WheelFit]]:
    """Wheels with the same reason codes share a row, the ones that fit first, then the fewest codes."""
    groups: dict[tuple[str, ...], list[WheelFit]] = {}
    for w in sorted(wheels, key=lambda w: (len(w.reasons), w.entry.file)):
        groups.setdefault(tuple(r.code for r in w.reasons), []).append(w)
    return list(groups.values())


def _group_reasons(group: Sequence[WheelFit]) -> Text:
    """Each code with its message where every wheel of the group says the same, else the code alone
    (the numbers differ from wheel to wheel; --json has each)."""
    text = Text()
    for i, reason in enumerate(group[0].reasons):
        same = all(w.reasons[i].message == reason.message for w in group)
        text.append(("\n" if i else "") + reason.code, style="bold red")
        if same:
            text.append(f" {reason.message}")
    return text


def _group_label(entries: Sequence[schema.IndexEntry], total: int, shown: int = 3) -> str:
    names = [wheel_name(e) for e in entries]
    if len(names) == 1:
        return names[0]
    if len(names) == total:
        return f"all {total} wheels"
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} wheels: {', '.join(names[:shown])}{more}"


def other_cpus(wheels: Sequence[WheelFit], env: Env) -> list[WheelFit]:
    """The wheels built for another CPU than this machine's, when some wheel is for this one (on a
    machine no wheel is built for, every wheel's reason matters and none is set aside)."""
    here = canonical(env.arch)
    others = [w for w in wheels if w.entry.info.platform and canonical(w.entry.info.platform) != here]
    ours = [w for w in wheels if w.entry.info.platform and canonical(w.entry.info.platform) == here]
    return others if ours else []


# Stands in for a space inside a `quoted command` while a line is wrapped (a private-use character:
# not whitespace to rich's wrap, one cell wide), so a command is never split across lines.
_KEPT_SPACE = "\ue000"
_QUOTED = re.compile(r"`[^`\n]+`")


def _item(console: Console, text: Text | str, indent: int = 0, hang: int = 2) -> None:
    """One item at `indent`, its wrapped lines `hang` further in, so they read as part of it; a
    `quoted command` stays on one line (one longer than the line is folded where it must be)."""
    text = Text(text) if isinstance(text, str) else text
    kept = _QUOTED.sub(lambda m: m.group().replace(" ", _KEPT_SPACE), text.plain)
    text = Text(kept, spans=list(text.spans), style=text.style)  # same length: the styles stay put
    width = max(console.width - indent - hang, 20)
    for i, line in enumerate(text.wrap(console, width)):
        line.rstrip()
        line = Text(line.plain.replace(_KEPT_SPACE, " "), spans=line.spans, style=line.style)
        console.print(Text(" " * (indent + (hang if i else 0))) + line, soft_wrap=True)


def _reasons(console: Console, found: Sequence[Reason], indent: int) -> None:
    for r in found:
        _item(console, Text.assemble((r.code, "bold red"), f" {r.message}"), indent)
        _item(console, Text(f"fix: {r.fix}", style="cyan"), indent + 2)


def _verdict_line(report: DoctorReport) -> Text:
    answer = report.answer
    text = Text(f"verdict: {answer.verdict}", style=_VERDICT_STYLE[answer.verdict])
    others = [a for a in report.dtypes[1:] if a.verdict != answer.verdict]
    if len(report.dtypes) > 1 and others and report.selection.selected is not None:
        text.append(f" for {answer.dtype}", style=_VERDICT_STYLE[answer.verdict])
    text.append(f" ({VERDICT_TEXT[answer.verdict]})", style="default")
    for other in others:
        text.append(f"; {other.dtype}: {other.verdict}", style=_VERDICT_STYLE[other.verdict])
    return text


def _gpu_rows(report: DoctorReport) -> list[tuple[str, list[int]]]:
    """GPUs with the same name, arch, answers and verification share a row: "GPUs 0-7 (H100, sm 9.0)"."""
    rows: dict[tuple[Any, ...], list[int]] = {}
    for i, g in enumerate(report.selection.gpus):
        key = (g.gpu.name, g.gpu.sm, tuple(a.gpus[i] for a in report.dtypes), _verified(report.env, g.gpu))
        rows.setdefault(key, []).append(i)
    out = []
    for (name, sm, *_rest), indexes in rows.items():
        run = indexes == list(range(indexes[0], indexes[-1] + 1))
        numbers = f"{indexes[0]}-{indexes[-1]}" if run else ", ".join(map(str, indexes))
        label = f"GPU {indexes[0]}" if len(indexes) == 1 else f"GPUs {numbers}"
        out.append((f"{label} {name} (sm {sm})", indexes))
    return out


def _verified(env: Any, gpu: Any) -> str:
    return verified.line(verified.machine(env, gpu)).strip()


def _render_gpus(report: DoctorReport, console: Console) -> None:
    """What runs for each dtype asked, GPU by GPU: the first screen's second half."""
    req, sel = report.request, report.selection
    call = f"head dim {req.head_dim}, {'forward+backward' if req.backward else 'forward'}"
    dtypes = sorted(report.dtypes, key=lambda a: DTYPES.index(a.dtype))
    if not sel.gpus:
        if sel.selected is not None:
            _item(console, f"No GPU, {call}:")
            _render_dtypes(report, console, [(a.dtype, a.runtime) for a in dtypes], None)
        return
    for label, indexes in _gpu_rows(report):
        first = indexes[0]
        gpu = sel.gpus[first].gpu
        _item(console, f"{label}, {call}:")
        _render_dtypes(report, console, [(a.dtype, a.gpus[first]) for a in dtypes], gpu.sm)
        _item(console, _verified(report.env, gpu), 2)


def _render_dtypes(
    report: DoctorReport, console: Console, runs: Sequence[tuple[str, Dispatch]], sm: str | None
) -> None:
    """One line per answer ("fp16, bf16: SASS for sm 8.0" when they agree), with what explains it and
    its reasons unless they are the verdict's own (printed under because:)."""
    same: dict[Dispatch, list[str]] = {}
    for dtype, runtime in runs:
        same.setdefault(runtime, []).append(dtype)
    for runtime, names in same.items():
        _item(console, f"{', '.join(names)}: {runtime_line(runtime)}", 2)
        if sm is not None and explain(runtime, sm):
            _item(console, explain(runtime, sm), 4)
        if runtime.reasons and runtime.reasons != report.answer.deciding:
            _reasons(console, runtime.reasons, 4)
        for r in runtime.passed_over:  # not a failure: why the arch-specific units leave this call
            _item(console, Text.assemble((r.code, "yellow"), f" {r.message}"), 4)
        for note in runtime.notes:  # not a fallback: what the kernels path leaves out here
            _item(console, Text.assemble((note.code, "yellow"), f" {note.message}"), 4)


def render(report: DoctorReport, console: Console, show_all: bool = False) -> None:
    """The report for people, answers first (the first screen at 80 columns): the verdict, the wheel fa
    install picks and its pip line, what runs for each dtype on each GPU and, when calls fall back or
    nothing fits, why and what to do. Then the machine, the other wheels as a count (each with its
    reasons and their fixes under `show_all`), and the other ways to install."""
    sel = report.selection
    answer = report.answer
    _item(console, _verdict_line(report))  # wrapped lines hang under it, as every item's do
    if sel.selected is not None:
        _item(console, f"wheel: {wheel_name(sel.selected)} (fa install picks it)")
        if sel.selected.info.all_wheel:
            _item(console, f"it acts here as: {acts_as(sel.selected, report.env)}", 2)
        if report.install is not None:
            console.print(Text(report.install.pip), soft_wrap=True)
        if report.missing_page is not None:
            note = f"  {report.missing_page} is missing: run fa index on the wheel folder first"
            console.print(Text(note, style="yellow"), soft_wrap=True)  # a path: kept whole
    _render_gpus(report, console)
    if answer.deciding:
        stack_codes = {r.code for r in sel.stack}
        own = [r for r in answer.deciding if r.code not in stack_codes]
        console.print("because:")
        if len(own) < len(answer.deciding):
            _item(console, f"the stack beneath fa (below): {', '.join(sorted(stack_codes))}", 2)
        _reasons(console, own, 2)
    if sel.why:
        _item(console, f"why this wheel: {readable_why(sel)}")
    for warning in sel.warnings:
        _item(
            console,
            Text.assemble(("warning ", "bold yellow"), (warning.code, "bold yellow"), f" {warning.message}"),
        )
    if len(sel.gpus) > 1:
        console.print("(the verdict is GPU 0's: torch's default device cuda:0)", style="dim")

    console.print(Text("\nMachine", style="bold"))
    for line in _env_line(report.env).splitlines():
        _item(console, line, 2)
    if sel.stack:
        console.print(Text("\nThe stack beneath fa", style="bold"))
        _reasons(console, sel.stack, 2)
    _render_wheels(report, console, show_all)
    _render_install(report, console)


def _render_wheels(report: DoctorReport, console: Console, show_all: bool) -> None:
    """The other wheels: a count (`show_all`: each group with its reasons, and their fixes when the
    verdict is not ok)."""
    sel = report.selection
    hidden = [] if show_all else other_cpus(sel.wheels, report.env)
    shown = [w for w in sel.wheels if w not in hidden]
    fit = sum(w.fits for w in shown)
    title = Text(f"\nWheels in {report.index_location}", style="bold")
    console.print(title, soft_wrap=True)
    if not show_all:
        count = f"{fit} fit here, {len(shown) - fit} do not"
        if hidden:
            count += f", {len(hidden)} for other CPUs not counted"
        _item(console, f"{count} (fa doctor --all lists each with its reasons)", 2)
        return
    for group in _groups(shown):
        mark = Text("yes ", style="green") if group[0].fits else Text("no  ", style="red")
        _item(console, Text.assemble(mark, _group_label([w.entry for w in group], len(shown))), 2, 4)
        if not group[0].fits:
            for line in _group_reasons(group).split("\n"):
                _item(console, line, 6)
    fixes = sorted(
        {(r.code, r.fix) for w in shown for r in w.reasons},
        key=lambda f: (reasons.code_order(f[0]), f[1]),
    )
    if fixes and report.answer.verdict not in ("ok", "ok-jit"):
        console.print(Text("\nFixes", style="bold"))
        for code, fix in fixes:
            _item(console, Text.assemble((code, "bold red"), (f": {fix}", "cyan")), 2)


def _render_install(report: DoctorReport, console: Console) -> None:
    """The other lines that install the chosen wheel (uv, pyproject.toml), never wrapped (they are pasted);
    the pip line is at the top."""
    lines = report.install
    if lines is None:
        return
    where = f"index {lines.index_name}" if lines.index_name else "the root index (the all-wheels)"
    console.print(Text(f"\nWith uv ({where}; pip's line is at the top)", style="bold"))
    console.print(Text(lines.uv), soft_wrap=True)
    console.print(Text("pyproject.toml, for uv sync:"))
    for line in lines.uv_pyproject.splitlines():
        console.print(Text(f"  {line}" if line else ""), soft_wrap=True)
