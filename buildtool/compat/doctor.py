"""`fa doctor`'s report: probe + rules + select, as JSON for scripts and as rich tables for people."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from buildtool.compat import verified
from buildtool.compat.choose import Dispatch, Reason, Request, Selection, WheelFit, select
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
    "ok-jit": "our kernels run, JIT-compiled from PTX by the driver on first use",
    "fallback": "a wheel installs, but calls fall back to torch SDPA",
    "no-wheel": "no wheel can be installed here",
}


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


def build_report(env: Env, index: WheelIndex, request: Request) -> DoctorReport:
    selection = select(index.entries, env, request)
    lines = missing = None
    if selection.selected is not None:
        lines = install_lines.install_lines(selection.selected, base_url(index))
        page = missing_pages(index, install_lines.index_path(lines.index_name))
        missing = None if page is None else str(page)
    return DoctorReport(
        env=env,
        request=request,
        index_location=index.location,
        selection=selection,
        install=lines,
        missing_page=missing,
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
    }


def report_json(report: DoctorReport) -> dict[str, Any]:
    sel = report.selection
    return {
        "verdict": sel.verdict,
        "selected": sel.selected.file if sel.selected else None,
        "variant": sel.selected.info.variant if sel.selected else None,
        # the all-wheel: the binding and CUDA major it uses here (null for any other wheel)
        "acts_as": _acts_as_json(sel.selected, report.env),
        "codes": list(sel.codes),
        "because": _reasons_json(sel.deciding),
        "why": sel.why,
        "warnings": _reasons_json(sel.warnings),
        "runtime": _runtime_json(sel.runtime),
        "gpus": [
            {
                "index": a.index,
                "name": a.gpu.name,
                "sm": a.gpu.sm,
                "runtime": _runtime_json(a.runtime),
                "explain": explain(a.runtime, a.gpu.sm),  # another arch's image serving it, or ""
                "check": verified.summary(verified.machine(report.env, a.gpu)),
            }
            for a in sel.gpus
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
            "dtype": report.request.dtype,
            "head_dim": report.request.head_dim,
            "backward": report.request.backward,
        },
        "env": env_to_json(report.env),
        "index": report.index_location,
        # pip and uv lines for the selected wheel (null when nothing is selected)
        "install": _install_json(report),
    }


def _reason_text(reasons: Sequence[Reason], fixes: bool = True) -> Text:
    text = Text()
    for i, r in enumerate(reasons):
        if i:
            text.append("\n")
        text.append(r.code, style="bold red")
        text.append(f" {r.message}")
        if fixes:
            text.append(f"\n  fix: {r.fix}", style="cyan")
    return text


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
    if runtime.path == "sass":
        return f"SASS for sm {runtime.arch}, head dim {runtime.head_dim}"
    if runtime.path == "ptx":
        return f"PTX for compute {runtime.arch} (JIT), head dim {runtime.head_dim}"
    return "fallback to torch SDPA"


def explain(runtime: Dispatch, sm: str) -> str:
    """Why an image of another arch serves this GPU (B300/GB300's 10.3 on 10.0's SASS, DGX Spark's 12.1
    on 12.0's), or "" when the image is the GPU's own or nothing runs (the reasons say why)."""
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


def render(report: DoctorReport, console: Console, show_all: bool = False) -> None:
    """The report for people, at 80 columns: the machine, the stack, the wheels grouped by their
    reasons (other CPUs' wheels set aside unless `show_all`), each reason's fix once, the choice, what
    the runtime does on each GPU and the verdict with what decides it."""
    sel, req = report.selection, report.request
    console.print(Text("Machine", style="bold"))
    console.print(Text(_env_line(report.env)))
    if sel.stack:
        console.print(Text("\nThe stack beneath fa", style="bold"))
        console.print(_reason_text(sel.stack))

    hidden = [] if show_all else other_cpus(sel.wheels, report.env)
    shown = [w for w in sel.wheels if w not in hidden]
    title = Text(f"\nWheels in {report.index_location}", style="bold")
    if hidden:
        n = len(hidden)
        title.append(f" ({n} for other CPUs not shown: --all shows them)", style="default")
    console.print(title)
    for group in _groups(shown):
        mark = Text("yes ", style="green") if group[0].fits else Text("no  ", style="red")
        console.print(Text.assemble(mark, _group_label([w.entry for w in group], len(shown))))
        if not group[0].fits:
            console.print(Padding(_group_reasons(group), (0, 0, 0, 4)))
    fixes = sorted(
        {(r.code, r.fix) for w in shown for r in w.reasons},
        key=lambda f: (reasons.code_order(f[0]), f[1]),
    )
    if fixes:
        console.print(Text("\nFixes", style="bold"))
    for code, fix in fixes:
        console.print(Text.assemble((code, "bold red"), (f": {fix}", "cyan")))

    call = f"{req.dtype}, head dim {req.head_dim}, {'forward+backward' if req.backward else 'forward'}"
    console.print(Text("\nChoice", style="bold"))
    console.print(Text(f"fa install picks: {wheel_name(sel.selected) if sel.selected else 'nothing'}"))
    if sel.selected is not None and sel.selected.info.all_wheel:
        console.print(Text(f"it acts here as: {acts_as(sel.selected, report.env)}"))
    if sel.why:
        console.print(Text(f"why: {sel.why}"))
    for warning in sel.warnings:
        console.print(
            Text.assemble(("warning ", "bold yellow"), (warning.code, "bold yellow"), f" {warning.message}")
        )
    for answer in sel.gpus:
        console.print(
            Text(
                f"GPU {answer.index} ({answer.gpu.name}, sm {answer.gpu.sm}), {call}: "
                f"{runtime_line(answer.runtime)}"
            )
        )
        if explain(answer.runtime, answer.gpu.sm):
            console.print(Text(f"  {explain(answer.runtime, answer.gpu.sm)}"))
        if answer.runtime.reasons:
            console.print(_reason_text(answer.runtime.reasons))
        console.print(Text(verified.line(verified.machine(report.env, answer.gpu))))
    if not sel.gpus and sel.selected is not None:
        console.print(Text(f"No GPU, {call}: {runtime_line(sel.runtime)}"))

    _render_install(report, console)

    verdict = Text(f"\nverdict: {sel.verdict}", style=_VERDICT_STYLE[sel.verdict])
    verdict.append(f" ({VERDICT_TEXT[sel.verdict]})", style="default")
    console.print(verdict)
    # The stack's reasons are printed above already: name them here, do not repeat them.
    stack_codes = {r.code for r in sel.stack}
    own = [r for r in sel.deciding if r.code not in stack_codes]
    if sel.deciding:
        console.print("because:")
    if sel.deciding and len(own) < len(sel.deciding):
        console.print(Text(f"  the stack beneath fa (above): {', '.join(sorted(stack_codes))}"))
    if own:
        console.print(_reason_text(own))
    if len(sel.gpus) > 1:
        console.print("(the verdict is GPU 0's: torch's default device cuda:0)", style="dim")


def _render_install(report: DoctorReport, console: Console) -> None:
    """The lines that install the chosen wheel with plain pip or uv, never wrapped (they are pasted)."""
    lines = report.install
    if lines is None:
        return
    where = f"index {lines.index_name}" if lines.index_name else "the root index (the all-wheels)"
    console.print(Text(f"\nWith pip or uv ({where})", style="bold"))
    if report.missing_page is not None:
        console.print(
            Text(f"{report.missing_page} is missing: run fa index on the wheel folder first"),
            style="yellow",
            soft_wrap=True,
        )
    for line in (lines.pip, lines.uv):
        console.print(Text(line), soft_wrap=True)
    console.print(Text("pyproject.toml, for uv sync:"))
    for line in lines.uv_pyproject.splitlines():
        console.print(Text(f"  {line}" if line else ""), soft_wrap=True)
