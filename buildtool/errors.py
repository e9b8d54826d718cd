"""What can go wrong in fa's commands: one hierarchy, each error carrying the exit code it ends the
command with. Commands raise these and never print or exit on their own; buildtool/cli.py prints the
message (plain text: it is never read as markup) and exits with the error's code.

    FaError          exit 1: the work failed (a compiler, a download, an install) or nothing fits
      UsageError     exit 2: bad input (a file, an option); the message says where and what to do
        InputError   exit 2: one value of one file or option, as `FILE: FIELD: what is wrong` + `fix: ...`

A module's own error (MatrixError, CompileError, ...) subclasses the one whose exit code it means.
"""

from __future__ import annotations

from typing import ClassVar

# The documented exit codes of every fa command.
EXIT_OK = 0  # done; for doctor, our kernels run
EXIT_FAILED = 1  # the work failed, or nothing fits (doctor: calls fall back or no wheel installs)
EXIT_USAGE = 2  # bad input: a file, a field, an option


class FaError(Exception):
    """A failure with a message for a person; exit code 1."""

    exit_code: ClassVar[int] = EXIT_FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.notes: list[str] = []

    def with_note(self, note: str) -> FaError:
        """Adds a line the command knows and the raiser does not (e.g. that finished work is cached)."""
        self.notes.append(note)
        return self

    def text(self) -> str:
        """The message and its notes, as cli.py prints them."""
        return "\n".join([str(self), *self.notes])


class UsageError(FaError):
    """Bad input; the message says where (the file or option) and how to fix it. Exit code 2."""

    exit_code: ClassVar[int] = EXIT_USAGE


def bad_input(source: str, field: str | None, problem: str, fix: str) -> str:
    """The one shape of a bad-input message: `FILE: FIELD: what is wrong` then `  fix: what to do`.

    source: the file or option (`matrix.yaml`, `--env envs/a.json`); field: where in it, written as the
    file writes it (`archs."12"[3]`, `gpus[0].sm`), None for the whole file or option."""
    where = f"{source}: {field}" if field else source
    return f"{where}: {problem}\n  fix: {fix}"


class InputError(UsageError):
    """One value of a file or option that fa cannot work with. Exit code 2."""

    def __init__(self, source: str, field: str | None, problem: str, fix: str) -> None:
        super().__init__(bad_input(source, field, problem, fix))
        self.source = source
        self.field = field
        self.problem = problem
        self.fix = fix
