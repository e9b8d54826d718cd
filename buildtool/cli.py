"""The `fa` command: a thin shell over the library. Each command lives in its own module under
buildtool/commands/ with a `register(app)`, named in commands.COMMANDS and imported only when it runs (or
when help lists it), so a command loads what it needs and no more: `fa doctor` never imports the build
pipeline. `fa probe` (what scripts, and `fa doctor --env` for another machine, start from) does not
even load the CLI framework: `main` runs it straight (bench/install/probe_time.py measures it). The typer
application itself is commands/_app.py; `app` here makes it on first use (for typer's CliRunner).

Commands raise buildtool.errors.FaError (or a subclass) for anything that stops them, and return an
exit status when their answer is a "no" (doctor's fallback, a failed install); commands.print_error is
the one place that prints an error, and the error's exit code is the command's.
"""

from __future__ import annotations

import sys
from typing import Any

from buildtool.commands import COMMANDS, DISTRIBUTION, print_error
from buildtool.errors import FaError

__all__ = ["COMMANDS", "DISTRIBUTION", "main", "print_error"]  # and `app`, made on first use


def _escape_unencodable() -> None:
    """A terminal or pipe that cannot encode a character (PYTHONIOENCODING=ascii, a C locale) shows it
    as an escape: a URL or GPU name with `é` in it must not end fa in a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def main() -> None:
    """The `fa` console script."""
    _escape_unencodable()
    args = sys.argv[1:]
    if args[:1] == ["probe"] and set(args[1:]) <= {"--json"}:
        from buildtool.commands import probe

        try:
            status = probe.run(as_json="--json" in args)
        except FaError as error:
            print_error(error)
            status = error.exit_code
        raise SystemExit(status)
    from buildtool.commands._app import make_app

    make_app()()


def __getattr__(name: str) -> Any:
    if name == "app":
        from buildtool.commands._app import make_app

        return make_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
