"""The fenced blocks of README.md, CONTRIBUTING.md and docs/*.md, and what each one's tag asks of it.

A block's info string is its language and one tag (```` ```bash network ````; GitHub colours by the
first word and ignores the rest). tests/ci/test_docs_run.py runs or checks every block by its tag, and
fails on a block without one, so a new example cannot slip in unchecked.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "CONTRIBUTING.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))

# What each tag means; the tests' docstrings say what is checked.
TAGS = {
    "network": "needs PyPI or another server: syntax and planning only",
    "gpu": "needs an NVIDIA GPU: syntax and planning only",
    "long": "takes minutes (a build, a benchmark, the suite): syntax and planning only",
    "synopsis": "usage lines: every option named exists on its command",
    "matrix": "a matrix file: fa build --dry-run plans it",
    "env": "a probe file: fa doctor --env reads it",
    "output": "what a command prints: the test makes the command print it",
    "recorded": "a real run's output a bench script --record wrote: its test asks the command again",
    "sketch": "a data shape: every name in it exists in the files the info string names",
    "tree": "a picture of the tree: every file and folder it names exists (outputs, after -->, aside)",
}

_FENCE = re.compile(r"^```(\S*)(?:[ \t]+(.*))?$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repo
    line: int  # of the opening fence
    lang: str
    tag: str  # "" when the info string has none
    arg: str  # what follows the tag (sketch: the file the names live in)
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> Iterator[Block]:
    for page in PAGES:
        lines = (REPO / page).read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i])
            if m:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                tag, _, arg = (m.group(2) or "").strip().partition(" ")
                yield Block(page, i + 1, m.group(1), tag, arg.strip(), "\n".join(lines[i + 1 : end]) + "\n")
                i = end
            i += 1


_OPERATORS = {"&&", "||", ";", "|", "&"}
_REDIRECT = re.compile(r"^\d?>>?$|^<$")


def commands(shell: str) -> Iterator[tuple[dict[str, str], list[str]]]:
    """Each simple command of a shell text: its variable assignments and its words (comments, operators
    and redirections dropped)."""
    for line in shell.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        skip_next = False
        for word in [*lexer, ";"]:
            if skip_next:
                skip_next = False
            elif _REDIRECT.match(word):
                skip_next = True  # its target is a file name, not a word of the command
            elif word in _OPERATORS:
                if words:
                    yield _split_assignments(words)
                words = []
            else:
                words.append(word)


def _split_assignments(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words
