"""`fa install`: the wheel fa doctor picks, hash-checked, installed without touching torch
(compat/install.py does the side effects); with --build, when no wheel fits this machine's torch, the
one wheel it needs is built first (compat/build_here.py). What does the work is imported after the
command's first line (commands.say): loading it takes a second."""

from __future__ import annotations

import os
import shlex
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from buildtool.commands import _options, say
from buildtool.commands._shared import IndexOpt, JsonOpt, WheelsOpt, load_wheel_index, print_json
from buildtool.core import interrupts
from buildtool.errors import EXIT_FAILED, EXIT_OK, FaError, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from buildtool.compat.choose import Selection
    from buildtool.compat.env import Env
    from buildtool.compat.wheel_index import WheelIndex

# How long a second fa install waits for the first, in minutes, as --wait's help says it
# (compat/install.py's LOCK_WAIT_S, which loading here would cost `fa install` its quick first line).
WAIT_HELP_MINUTES = 5

BUILD_HINT = (
    "fa install --build builds the one wheel this machine needs (this torch, CPU, CUDA major and GPU arch)"
)


def _kernel_wheel_fits(selection: Selection) -> bool:
    return selection.selected is not None and not selection.selected.info.universal


def _serves(selection: Selection, arch: str | None, cuda: int | None) -> bool:
    """Does the chosen wheel carry SASS for --arch under CUDA major --cuda (either may be unset)?"""
    if not _kernel_wheel_fits(selection):
        return False
    assert selection.selected is not None
    info = selection.selected.info
    sets: list[tuple[int | None, tuple[str, ...]]] = [(k.cuda_major, k.sass) for k in info.kernel_sets]
    sets = sets or [(info.cuda_major, info.sass)]
    return any((cuda is None or major == cuda) and (arch is None or arch in sass) for major, sass in sets)


def _must_build(selection: Selection, build: bool, rebuild: bool, arch: str | None, cuda: int | None) -> bool:
    """--build builds only when no wheel in the index fits (or none holds what --arch/--cuda ask for);
    --rebuild builds even then."""
    return rebuild or (build and not _serves(selection, arch, cuda))


def _index_or_none(wheels: Path | None, index: str | None) -> WheelIndex | None:
    """With --build the index may be absent (nothing built yet): that is "no wheel fits". So is a wheel
    folder that is there but holds no index and no wheel (only `fa build --local`'s local/, or the logs
    of a build stopped before its index); a folder that is not there is still refused (a typo)."""
    folder = Path("wheels") if wheels is None else wheels
    if index is None and ((wheels is None and not folder.is_dir()) or _holds_no_wheel(folder)):
        return None
    return load_wheel_index(wheels, index)


def _holds_no_wheel(folder: Path) -> bool:
    try:
        return folder.is_dir() and not (folder / "index.json").exists() and not any(folder.glob("*.whl"))
    except OSError:
        return False


def _build_here(
    env: Env, arch: str | None, cuda: int | None, jobs: int, console: Console, progress: bool
) -> tuple[WheelIndex, Selection]:
    """Raises InputError (exit 2) when the probe and options cannot say what to build, FaError (exit 1)
    when the build fails. With --arch or --cuda the choice is among this build's wheels only: the
    folder may hold an earlier build for another arch or CUDA major, which the options rule out."""
    from buildtool.compat import build_here  # the build pipeline: loaded only when it runs
    from buildtool.compat.choose import Request, select
    from buildtool.compat.wheel_index import WheelIndex, load_index

    matrix = build_here.release_matrix()
    target = build_here.target(env, arch, cuda, matrix)
    console.print(
        f"building the wheel for torch {target.torch_version}, CUDA {target.cuda_major}, sm {target.arch} "
        f"into {build_here.out_dir()}",
        highlight=False,
    )
    try:
        summary = build_here.build(target, matrix, jobs, show_progress=progress)
    except FaError as exc:
        raise exc.with_note(
            "fa install --build: nothing installed (finished work is cached: run it again)"
        ) from None
    built = load_index(str(build_here.out_dir()))
    if arch is not None or cuda is not None:
        made = {w.file for w in summary.wheels}
        built = WheelIndex(built.location, tuple(e for e in built.entries if e.file in made))
    return built, select(built.entries, env, Request())


def install_cmd(
    wheels: WheelsOpt = None,
    index: IndexOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the choice and the command; change nothing")
    ] = False,
    as_json: JsonOpt = False,
    build: Annotated[
        bool,
        typer.Option(
            "--build",
            help="When no wheel in the index fits this machine (or holds what --arch/--cuda ask for), "
            "build the one it needs, then install it; a wheel that fits is installed, not rebuilt",
        ),
    ] = False,
    rebuild: Annotated[
        bool,
        typer.Option(
            "--rebuild",
            help="Build the wheel this machine needs and install it even when a wheel in the index fits "
            "(implies --build)",
        ),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also print each step's exact command")
    ] = False,
    arch: Annotated[
        str | None, typer.Option(help="With --build: the GPU's compute capability (default: GPU 0's)")
    ] = None,
    cuda: Annotated[
        int | None, typer.Option(help="With --build: the CUDA major (default: the installed torch's)")
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="With --build: parallel compiles")
    ] = os.cpu_count() or 1,
    allow_downgrade: Annotated[
        bool,
        typer.Option("--allow-downgrade", help="Install a version older than the installed fa-attn"),
    ] = False,
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            help="Seconds to wait for another fa install into the same environment (0: stop at once; "
            f"default: {WAIT_HELP_MINUTES} minutes)",
        ),
    ] = None,
) -> int:
    """Install the wheel fa doctor picks for this machine, checked against the index's sha256.

    With --build, when no wheel in the index fits this machine's torch (a minor nobody built, a local
    torch build), build the one wheel it needs first: this torch, CPU, CUDA major and GPU arch only.
    A wheel that fits is installed, not rebuilt; --rebuild builds anyway.

    One fa install per environment at a time: a second one waits (--wait). Interrupted (Ctrl-C, SIGTERM)
    it rolls back; killed outright, the next fa install rolls back or finishes what it left, and says so.

    Exit codes: 0 installed (or, with --dry-run, a wheel would be), 1 nothing fits or the install, or the
    build, was refused or failed (the environment is left as it was, or the message says what changed),
    2 usage, 130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM (rolled back: the message says so)."""
    with interrupts.handling_signals():
        try:
            return _install(
                wheels,
                index,
                dry_run,
                as_json,
                build or rebuild,
                rebuild,
                verbose,
                arch,
                cuda,
                jobs,
                allow_downgrade,
                wait,
            )
        except interrupts.Interrupted as exc:
            state = exc.state or "nothing had changed: the environment is as it was"
            sys.stderr.write(f"fa install: interrupted by {exc.name}; {state}\n")
            return exc.exit_code


def _install(
    wheels: Path | None,
    index: str | None,
    dry_run: bool,
    as_json: bool,
    build: bool,
    rebuild: bool,
    verbose: bool,
    arch: str | None,
    cuda: int | None,
    jobs: int,
    allow_downgrade: bool,
    wait: float | None,
) -> int:
    if (arch is not None or cuda is not None) and not build:
        raise UsageError("--arch and --cuda only go with --build")
    _options.jobs(jobs)
    if wait is not None:
        _options.wait_seconds(wait)
    if cuda is not None:
        _options.cuda_major(cuda)
    if arch is not None:
        _options.arch(arch, cuda)
    where = index if index is not None else wheels or Path("wheels")
    say("install", f"probing this machine and reading the wheels in {where}")
    from buildtool.compat import install
    from buildtool.compat.choose import Request, select
    from buildtool.compat.install_site import placement_notes
    from buildtool.compat.probe import probe
    from buildtool.compat.wheel_index import WheelIndex
    from buildtool.core.console import plain_console

    if wait is None:
        wait = install.LOCK_WAIT_S
    idx = _index_or_none(wheels, index) if build else load_wheel_index(wheels, index)
    env = probe()
    selection = select(idx.entries if idx else (), env, Request())
    console = plain_console(stderr=as_json)
    built = False
    # --arch / --cuda describe the wheel to build: they are honoured (or refused with the reason) even
    # when a wheel in the index fits but lacks what they ask for, which would otherwise be installed
    # with both options ignored.
    asked = arch is not None or cuda is not None
    if build and asked:
        from buildtool.compat import build_here

        build_here.target(env, arch, cuda, build_here.release_matrix())  # refuses what cannot run here
    must_build = _must_build(selection, build, rebuild, arch, cuda)
    if must_build and not dry_run:
        idx, selection = _build_here(env, arch, cuda, jobs, console, progress=not as_json)
        built = True
    if idx is None:  # --build --dry-run with no index yet: nothing to install from
        idx = WheelIndex(location="(none)", entries=())
    plan = install.plan_install(idx, selection, install.default_installer(sys.executable))
    out: dict[str, Any] = {
        "verdict": selection.verdict,
        "selected": plan.entry.file if plan.entry else None,
        "variant": plan.entry.info.variant if plan.entry else None,
        "codes": list(selection.codes),
        "source": plan.source,
        "command": plan.command(),
        "dry_run": dry_run,
        "ok": False,
        "installed": None,
        "previous": None,
        "message": "",
        "downgrade": plan.downgrade,
        "built": built,
        "why": selection.why,
        "warnings": [{"code": w.code, "message": w.message, "fix": w.fix} for w in selection.warnings],
    }
    if not as_json:
        _render_choice(out, idx.location, console, verbose)
    if plan.entry is None:
        out["message"] = "no wheel fits this machine; run fa doctor to see why"
        if not build and env.torch is not None:
            out["message"] += f"\n  fix: {BUILD_HINT}"
        elif build and dry_run:
            out["message"] += "\n  (without --dry-run, --build builds the wheel this machine needs)"
    elif dry_run and must_build and _kernel_wheel_fits(selection):
        out["ok"] = True
        out["message"] = (
            "dry run: nothing built or installed (a real run builds the wheel "
            + ("--arch/--cuda ask for" if asked else "this machine needs")
            + ", labelled as a local build, and installs it instead of the index's)"
        )
    elif dry_run:
        out["ok"] = True
        out["message"] = (
            f"dry run: nothing installed (a real run installs a copy of {plan.source} "
            "after checking its sha256 against the index)"
        )
    else:
        for note in placement_notes():
            _print(console, f"note:    {note}", style="yellow")
        try:
            result = install.run_install(
                plan,
                idx,
                log=(lambda line: console.print(line, style="dim", highlight=False))
                if verbose
                else (lambda _: None),
                say=lambda line: _print(console, f"note:    {line}", style="yellow"),
                options=install.Options(allow_older=allow_downgrade, wait_s=wait),
            )
            out.update(
                ok=True,
                installed=result.installed,
                previous=result.previous,
                message=f"installed fa-attn {result.installed} ({result.location})",
            )
        except install.FAILURES as exc:
            out["message"] = str(exc)
    if as_json:
        print_json(out)
    else:
        _render_install(out, console)
    return EXIT_OK if out["ok"] else EXIT_FAILED


_VERDICT_SENTENCES = {
    "ok": "its kernels run on this machine's GPU",
    "ok-jit": "its kernels run on this machine's GPU once the driver has compiled their PTX (the first call)",
    "fallback": "fa_attn calls torch SDPA here instead of its kernels ({codes}); fa doctor says why",
}


def _print(console: Console, text: str, style: str = "") -> None:
    """Each line of `text` wrapped at the console's width between words, never inside one (a file name
    or a URL stays whole, to copy), its wrapped lines indented under it."""
    for line in text.split("\n"):
        lead = " " * (len(line) - len(line.lstrip(" ")))
        wrapped = textwrap.wrap(
            line,
            max(console.width, 40),
            subsequent_indent=lead + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        for part in wrapped or [""]:
            console.print(part, style=style, highlight=False, soft_wrap=True)


def _render_choice(out: dict[str, Any], location: str, console: Console, verbose: bool) -> None:
    """What fa install is about to install, from where and why, in sentences (before it starts)."""
    if out["selected"] is None:
        return
    built = " (built here)" if out["built"] else ""
    verb = "would install" if out["dry_run"] else "installing"
    _print(console, f"{verb} {out['selected']}{built}\n  from {location}")
    if out["why"]:
        _print(console, f"  chosen: {out['why']}")
    said = _VERDICT_SENTENCES.get(out["verdict"])
    if said:
        _print(console, "  " + said.format(codes=", ".join(out["codes"])))
    for warning in out["warnings"]:
        _print(console, f"  warning: {warning['message']}", style="yellow")
    if out["downgrade"]:
        _print(console, f"  note: {out['downgrade']}", style="yellow")
    if verbose and out["command"]:
        _print(console, "  trial install: " + shlex.join(out["command"]))


def _render_install(out: dict[str, Any], console: Console) -> None:
    """The result: installed (and what it replaced) or why not."""
    if out["ok"] and out["installed"]:
        _print(
            console,
            "checked: its sha256 matches the index; it installed and imported in a scratch folder first",
        )
    if out["ok"] and out["previous"]:
        _print(
            console,
            f"set aside fa-attn {out['previous']} while the new one was checked; it is now removed",
        )
    style = "green" if out["ok"] else "bold red"
    _print(console, out["message"], style=style)


def register(app: typer.Typer) -> None:
    app.command("install")(install_cmd)
