"""Every fenced block of README.md, CONTRIBUTING.md and docs/ is run or checked, by its tag
(tests/ci/doc_blocks.py): a matrix is planned, a probe file is read by fa doctor, printed errors are
printed again, a data shape's names exist in its file, a tree's paths exist. Blocks that need a GPU,
the network or minutes (`gpu`, `network`, `long`) are checked for syntax and planning only: bash -n,
every `fa` command's options parsed by fa's own CLI (and every `fa build` planned with --dry-run,
offline), every script, module, test path, extra and environment variable they name exists; Python is
compiled and every name it imports or reaches through a module exists. Nothing here runs on a GPU or
reaches the network."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.exceptions import TyperException
from typer.testing import CliRunner

from buildtool.builder import pypi
from buildtool.commands import DISTRIBUTION
from buildtool.commands._app import make_app
from tests.ci import offline_catalog
from tests.ci.doc_blocks import PAGES, REPO, TAGS, Block, blocks, commands
from tests.select.fixture_index import fixture_index

ALL = list(blocks())
PLANNED = ("gpu", "network", "long")
# Commands the planning check does not look into: they come from elsewhere (pre-commit from PyPI).
EXTERNAL = {"pre-commit"}
# The shell's own `.`: a block activating the venv it just made.
BUILTINS = {".", "source"}


def tagged(*tags: str, langs: tuple[str, ...] = ()) -> list[Any]:
    return [pytest.param(b, id=b.where) for b in ALL if b.tag in tags and (not langs or b.lang in langs)]


def test_every_block_has_a_known_tag() -> None:
    untagged = [
        f"{b.where} ({b.lang or 'no language'} {b.tag or 'no tag'})" for b in ALL if b.tag not in TAGS
    ]
    assert not untagged, f"tag these blocks with one of {sorted(TAGS)}: {untagged}"


def test_every_page_is_read() -> None:
    assert {b.page for b in ALL} >= {"README.md", "docs/matrix.md", "docs/doctor.md"}
    assert set(PAGES) >= {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}


# --- fa's own CLI, offline ---------------------------------------------------------------------------


@cache
def _root() -> Any:
    return typer.main.get_command(make_app())


def fa_command(words: list[str]) -> tuple[Any, list[str]]:
    """The click command `fa WORDS` names and the words left for its options."""
    command, rest = _root(), list(words)
    while hasattr(command, "get_command") and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        sub = command.get_command(None, name)
        assert sub is not None, f"fa has no command {name!r}"
        command = sub
    return command, rest


def option_names(command: Any) -> set[str]:
    return {name for p in command.params for name in (*p.opts, *p.secondary_opts)} | {"--help"}


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An FA_CACHE whose torch catalog is the fixture's (tests/ci/offline_catalog.py), fresh, so fa build
    reads no index."""
    data = offline_catalog.simple_json()
    monkeypatch.setenv("FA_PYPI_SIMPLE", "http://127.0.0.1:9/simple")  # nothing listens: never online
    data[pypi.SOURCE_KEY] = pypi.torch_page_url()  # the cache holds that index's answer
    (tmp_path / "cache" / "pypi").mkdir(parents=True)
    (tmp_path / "cache" / "pypi" / "torch.json").write_text(json.dumps(data))
    monkeypatch.setenv("FA_CACHE", str(tmp_path / "cache"))
    return tmp_path


def run_fa(*args: str) -> Any:
    return CliRunner().invoke(make_app(), list(args))


# --- gpu, network, long: syntax and planning ---------------------------------------------------------


@pytest.mark.usefixtures("offline")
@pytest.mark.parametrize("block", tagged(*PLANNED, langs=("bash", "sh")))
def test_shell_block_parses_and_plans(block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    syntax = subprocess.run(["bash", "-n"], input=block.text, text=True, capture_output=True, check=False)
    assert syntax.returncode == 0, f"{block.where}: {syntax.stderr}"
    monkeypatch.chdir(REPO)  # the docs' paths are the checkout's
    for env, words in commands(block.text):
        for name in env:
            assert name in _tree_text(), f"{block.where}: nothing in the tree reads {name}"
        _plan(block, words)


def _plan(block: Block, words: list[str]) -> None:
    program = words[0] if words[0] in BUILTINS else Path(words[0]).name  # .venv/bin/pip is pip
    args = words[1:]
    where = f"{block.where}: {' '.join(words)}"
    if program == "fa":
        command, rest = fa_command(args)
        try:
            command.make_context("fa", list(rest))
        except TyperException as e:  # typer vendors click: its UsageError derives from this
            pytest.fail(f"{where}: {e}")
        if args[:1] == ["build"] and "--dry-run" not in args:
            result = run_fa(*args, "--dry-run", "--no-progress")
            assert result.exit_code == 0, f"{where} --dry-run: {result.output}"
    elif program in ("python", "python3"):
        _plan_python(where, args)
    elif program == "bash":
        assert (REPO / args[0]).is_file(), where
    elif program == "pip":
        _plan_pip(where, args)
    else:
        assert program in EXTERNAL | BUILTINS, f"{where}: teach tests/ci/test_docs_run.py what {program} is"


def _plan_python(where: str, args: list[str]) -> None:
    if args[0] == "-m":
        module, rest = args[1], args[2:]
        assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
        if module == "pytest":
            for path in (a.split("::")[0] for a in rest if not a.startswith("-")):
                assert (REPO / path).exists(), f"{where}: no {path}"
        return
    script = REPO / args[0]
    assert script.is_file(), f"{where}: no {args[0]}"
    text = script.read_text()
    for flag in (a for a in args[1:] if a.startswith("--")):
        assert f'"{flag}"' in text, f"{where}: {args[0]} defines no {flag}"


def _plan_pip(where: str, args: list[str]) -> None:
    extras_here = importlib.metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or []
    for i, arg in enumerate(args):
        if args[i - 1] == "-e" and i > 0:
            path, _, extras = arg.partition("[")
            assert (REPO / path / "pyproject.toml").is_file(), where
            for extra in filter(None, extras.rstrip("]").split(",")):
                assert extra in extras_here, f"{where}: no extra {extra}"


@cache
def _tree_text() -> str:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    parts = []
    for name in files.split():
        if name.endswith((".py", ".sh", ".toml", ".yml", ".yaml", ".cfg")) or name.startswith(".ci/"):
            parts.append((REPO / name).read_text(errors="replace"))
    return "\n".join(parts)


@pytest.mark.parametrize("block", tagged(*PLANNED, langs=("python",)))
def test_python_block_compiles_and_its_names_exist(block: Block) -> None:
    tree = ast.parse(block.text, filename=block.where)
    modules: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                modules[alias.asname or alias.name] = importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{block.where}: {node.module} has no {alias.name}"
    for node in ast.walk(tree):
        chain = _attribute_chain(node)
        if chain and chain[0] in modules:
            _resolve(block, modules[chain[0]], chain)


def _attribute_chain(node: ast.AST) -> list[str]:
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.insert(0, node.attr)
        node = node.value
    return [node.id, *names] if isinstance(node, ast.Name) and names else []


def _resolve(block: Block, value: Any, chain: list[str]) -> None:
    for i, name in enumerate(chain[1:], 1):
        if not hasattr(value, name):  # a submodule not imported yet by its package
            importlib.import_module(f"{value.__name__}.{name}")
        assert hasattr(value, name), f"{block.where}: {'.'.join(chain[: i + 1])} does not exist"
        value = getattr(value, name)


# --- synopsis, matrix, env, output ---------------------------------------------------------------------


@pytest.mark.parametrize("block", tagged("synopsis"))
def test_synopsis_names_only_options_that_exist(block: Block) -> None:
    for _, words in commands(block.text.replace("[", " ").replace("]", " ").replace("|", " ")):
        if words[0] == "python":
            assert importlib.util.find_spec(words[2]) is not None, f"{block.where}: no module {words[2]}"
            continue
        assert words[0] == "fa", f"{block.where}: a synopsis of fa's commands: {words}"
        command, rest = fa_command(words[1:])
        unknown = {w for w in rest if w.startswith("--")} - option_names(command)
        assert not unknown, f"{block.where}: {' '.join(words[:2])} has no {sorted(unknown)}"


@pytest.mark.parametrize("block", tagged("matrix"))
def test_matrix_block_plans(block: Block, offline: Path) -> None:
    path = offline / "matrix.yaml"
    path.write_text(block.text)
    result = run_fa("build", "--matrix", str(path), "--dry-run", "--json")
    assert result.exit_code == 0, f"{block.where}: {result.output}"
    forms = {w["form"] for w in json.loads(result.stdout)["wheels"] if w["cuda_major"]}
    assert forms, block.where
    if "stable_abi:" in block.text:  # the key the example shows gives what it says: a stable-ABI wheel
        assert "stable" in forms, block.where


@pytest.mark.parametrize("block", tagged("env"))
def test_env_block_is_read_by_doctor(block: Block, tmp_path: Path) -> None:
    (tmp_path / "node.json").write_text(block.text)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "index.json").write_text(json.dumps(fixture_index()))
    result = run_fa(
        "doctor", "--env", str(tmp_path / "node.json"), "--wheels", str(tmp_path / "wheels"), "--json"
    )
    assert result.exit_code in (0, 1), f"{block.where}: {result.output}"  # 1: nothing fits, still read
    report = json.loads(result.stdout)
    gpus = [g["sm"] for g in json.loads(block.text)["gpus"]]
    assert [g["sm"] for g in report["env"]["gpus"]] == gpus, block.where


# The matrices whose mistakes docs/matrix.md's errors show, one mistake each.
MISTAKES = {
    "docs/matrix.md": [
        'torch: ["2.8"]\ncuda: [11]\npython: ["3.11"]\narchs: {"11": ["10.0"]}\n',
        'torch: ["2.8", "2.16"]\ncuda: [12]\npython: ["3.11"]\n',
        'torch: ["2.8"]\ncuda: [12]\npyton: ["3.11"]\n',
    ],
}


@pytest.mark.parametrize("block", tagged("output"))
def test_printed_errors_are_what_fa_prints(
    block: Block, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(offline)
    printed = []
    for text in MISTAKES[block.page]:
        (offline / "matrix.yaml").write_text(text)
        result = run_fa("build", "--matrix", "matrix.yaml", "--dry-run")
        assert result.exit_code == 2, result.output
        said, _, error = result.stderr.partition("\n")  # the command's first line (commands.say), then
        assert said.startswith("fa build: planning"), said  # the error the block shows
        printed.append(error.strip())
    assert "\n".join(printed) + "\n" == block.text


# --- sketch, tree: the names exist ---------------------------------------------------------------------


@pytest.mark.parametrize("block", tagged("sketch"))
def test_sketch_names_exist_in_their_file(block: Block) -> None:
    source = "\n".join((REPO / name).read_text() for name in block.arg.split())
    if block.lang == "json":
        names = set(re.findall(r'"(\w+)"\s*:', block.text))
    else:
        names = set(re.findall(r"^\s*(?:class|def)\s+(\w+)", block.text, re.MULTILINE))
        names |= set(re.findall(r"^\s*(\w+)\s*[:=]", block.text, re.MULTILINE))
        names |= set(re.findall(r"^\s*(\w+),\s*\w+\s*:", block.text, re.MULTILINE))  # "fwd, bwd: ..."
    missing = sorted(n for n in names if not re.search(rf"\b{n}\b", source))
    assert names, block.where
    assert not missing, f"{block.where}: {block.arg} has no {missing}"


_SOURCE_SUFFIXES = (".py", ".h", ".cuh", ".cu", ".cpp", ".j2", ".yaml", ".yml", ".md", ".toml")


@pytest.mark.parametrize("block", tagged("tree"))
def test_tree_paths_exist(block: Block) -> None:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    paths = set(files.split())
    paths |= {str(Path(p).parent) + "/" for p in list(paths)} | {p.rsplit("/", 1)[0] + "/" for p in paths}
    tops = {p.split("/")[0] + "/" for p in paths}
    named = set()
    sources = "\n".join(line.rsplit("-->", 1)[0] for line in block.text.splitlines())  # not outputs
    for word in sources.split():
        word = word.strip("(),:;`")
        if re.search(r"[*<>(]", word) or len(word) < 2:
            continue
        if word.endswith(_SOURCE_SUFFIXES) or word.endswith("/") or any(word.startswith(t) for t in tops):
            named.add(word)
    missing = sorted(
        w for w in named if not any(p == w or p.endswith("/" + w) or p == f"{w}.py" for p in paths)
    )
    assert named, block.where
    assert not missing, f"{block.where}: no {missing} in the tree"
