"""Every command the README and the docs show still runs as shown: each shell block is run by bash with
stand-ins for `videobert`, `python` and every other program, which record what they were called with (so
loops, variables and `$(...)` expand as a reader's shell would expand them), and each `videobert` or
`python -m pipeline` call is parsed by the real command line, its usage checks included, with its
command's `--help` run; each `--set KEY=...` names a config key; each `make TARGET` names a target of the
Makefile; each script a `python` line runs exists. Commands quoted in the prose (`videobert ...` code
spans) name a command and options it has. The generated reference pages cover every config key and every
table of schemas/."""

from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import schemas
from pipeline import cli, registry
from pipeline.cli import table

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"^```(?:sh|bash|shell|console)\n(.*?)^```", re.S | re.M)
CODE_SPAN = re.compile(r"`((?:\.venv/bin/)?videobert [^`]+|(?:\.venv/bin/)?python -m pipeline [^`]+|make [a-z][^`]*)`")
sys.path.insert(0, str(REPO / "scripts"))
import docs_reference  # noqa: E402

# the stand-ins: each records its argv as one JSON line; everything else a block calls is a no-op
RECORDER = """#!{python}
import json, os, sys
with open(os.environ["DOCS_CALLS"], "a") as out:
    out.write(json.dumps([{name!r}, *sys.argv[1:]]) + "\\n")
"""
PRELUDE = """
command_not_found_handle() { return 0; }
source() { return 0; }
"""


def shell_blocks() -> list[tuple[str, str]]:
    return [
        (page.relative_to(REPO).as_posix(), block) for page in PAGES for block in SHELL_BLOCK.findall(page.read_text())
    ]


def _recorded_calls(block: str, tmp_path: Path) -> list[list[str]]:
    """What a reader's bash would call, each program's argv, with `videobert`, `python`, `make` and their
    .venv/bin spellings recording and every other program doing nothing."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    for where in (bin_dir, tmp_path / ".venv" / "bin"):
        where.mkdir(parents=True, exist_ok=True)
        for name in ("videobert", "python", "python3", "python3.11", "make"):
            stand_in = where / name
            stand_in.write_text(
                RECORDER.format(python=sys.executable, name="python" if name.startswith("python") else name)
            )
            stand_in.chmod(0o755)
    calls.write_text("")
    result = subprocess.run(
        ["/bin/bash", "-c", PRELUDE + block],
        cwd=tmp_path,
        env={"PATH": str(bin_dir), "DOCS_CALLS": str(calls), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "syntax error" not in result.stderr, result.stderr
    return [json.loads(line) for line in calls.read_text().splitlines()]


def _pipeline_argv(call: list[str]) -> list[str] | None:
    """The pipeline's own arguments of a recorded call, or None when it is not the pipeline's command."""
    if call[0] == "videobert":
        return call[1:]
    if call[0] == "python" and call[1:3] == ["-m", "pipeline"]:
        return call[3:]
    return None


def _subparsers() -> dict[str, object]:
    parser = table.build_parser()
    (group,) = [action for action in parser._actions if action.choices and action.dest == "command"]
    return group.choices


def _config_keys_set(argv: list[str]) -> list[str]:
    return [argv[at + 1].split("=", 1)[0] for at, arg in enumerate(argv[:-1]) if arg == "--set"]


def _make_targets() -> set[str]:
    targets = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\- ]+):(?!=)", line)
        if match:
            targets.update(match.group(1).split())
    return targets


def _check_pipeline_call(argv: list[str], where: str, helps_run: set[str]) -> None:
    shown = f"{where}: `videobert {shlex.join(argv)}`"
    try:
        args = table.build_parser().parse_args(argv)
    except SystemExit as stop:
        pytest.fail(f"{shown} does not parse (exit {stop.code})")
    entry = table.command(args.command)
    problem = cli._option_problem(args) or (entry.usage_problem(args) if entry.usage_problem else None)
    assert problem is None, f"{shown}: {problem}"
    unknown = set(_config_keys_set(argv)) - set(docs_reference.config_keys())
    assert not unknown, f"{shown} sets keys no config has: {sorted(unknown)}"
    if args.command not in helps_run:
        helps_run.add(args.command)
        with contextlib.redirect_stdout(io.StringIO()) as printed, pytest.raises(SystemExit) as stop:
            cli.main([args.command, "--help"])
        assert stop.value.code == 0 and args.command in printed.getvalue(), shown


def test_every_shell_block_of_the_docs_runs_as_shown(tmp_path):
    blocks = shell_blocks()
    assert len(blocks) >= 10, "the README and docs/ show their commands in ```sh blocks"
    targets, helps_run, pipeline_calls = _make_targets(), set(), 0
    for index, (where, block) in enumerate(blocks):
        calls = _recorded_calls(block, tmp_path / f"block{index}")
        assert calls, f"{where}: a shell block that calls nothing:\n{block}"
        for call in calls:
            argv = _pipeline_argv(call)
            if argv is not None:
                pipeline_calls += 1
                _check_pipeline_call(argv, where, helps_run)
            elif call[0] == "make":
                named = [arg for arg in call[1:] if not arg.startswith("-") and "=" not in arg]
                assert set(named) <= targets, f"{where}: `make {shlex.join(call[1:])}`: no such target"
            elif call[0] == "python":
                script = next(arg for arg in call[1:] if not arg.startswith("-"))
                assert (REPO / script).is_file(), f"{where}: `python {shlex.join(call[1:])}`: no {script}"
    # the loops expand: every stage of a `for stage in ...` line is one call
    assert pipeline_calls >= 40


def test_every_command_quoted_in_the_prose_has_the_options_it_shows():
    subparsers, targets, quoted = _subparsers(), _make_targets(), 0
    for page in PAGES:
        for span in CODE_SPAN.findall(page.read_text()):
            where = f"{page.relative_to(REPO)}: `{span}`"
            words = span.split()
            if words[0] == "make":
                named = [word for word in words[1:] if re.fullmatch(r"[a-z][a-z0-9-]*\*?", word)]
                assert named and fnmatch.filter(targets, named[0]), f"{where}: no such make target"
                continue
            words = words[3:] if words[0].endswith("python") else words[1:]
            if not words or words[0].startswith("-"):  # `videobert --version`, `videobert --help`
                assert all(word in ("--version", "--help", "-h") for word in words), where
                continue
            shown = {word.split("=", 1)[0] for word in words[1:] if word.startswith("--")}
            if words[0] == "STAGE":  # a stage's command: some stage has every option shown
                assert any(shown <= set(subparsers[name]._option_string_actions) for name in registry.ORDER), where
            else:
                assert words[0] in subparsers, f"{where}: no command {words[0]}"
                unknown = shown - set(subparsers[words[0]]._option_string_actions)
                assert not unknown, f"{where}: {words[0]} has no option {sorted(unknown)}"
            quoted += 1
    assert quoted >= 20


def test_the_console_command_answers_its_version_and_help():
    console = Path(sys.executable).parent / "videobert"
    program = [str(console)] if console.exists() else [sys.executable, "-m", "pipeline"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    version = subprocess.run([*program, "--version"], capture_output=True, text=True, timeout=120, env=env)
    assert version.returncode == 0 and re.search(r"\d+\.\d+", version.stdout), version
    helped = subprocess.run([*program, "--help"], capture_output=True, text=True, timeout=120, env=env)
    assert helped.returncode == 0 and all(name in helped.stdout for name in ("run", "train", "report"))


def test_the_reference_pages_cover_every_config_key_and_every_table():
    pages = docs_reference.pages()
    config_page, schemas_page = pages[docs_reference.CONFIG_PAGE], pages[docs_reference.SCHEMAS_PAGE]
    from pipeline.config import load_config

    def keys(section, prefix=""):
        import dataclasses

        for field in dataclasses.fields(section):
            value = getattr(section, field.name)
            if dataclasses.is_dataclass(value):
                yield from keys(value, f"{prefix}{field.name}.")
            else:
                yield f"{prefix}{field.name}"

    every_key = sorted(keys(load_config(None, [])))
    assert sorted(docs_reference.config_keys()) == every_key
    missing = [key for key in every_key if f"`{key}`" not in config_page]
    assert not missing, f"the config reference leaves out {missing}"
    # a key's help is the comment beside it in the source, and every key has one
    unexplained = [key.key for section in docs_reference.config_sections() for key in section.keys if not key.help]
    assert not unexplained, f"config keys without a comment to say what they are: {unexplained}"
    assert "features sampled (evenly across shards) to fit the tree" in config_page

    tables = {
        name: value.arrow
        for name, value in vars(schemas).items()
        if isinstance(getattr(value, "arrow", None), pa.Schema)
    }
    assert tables and sorted(tables) == sorted(name for name, _ in docs_reference.schema_tables())
    for name, schema in tables.items():
        absent = [column for column in schema.names if f"`{column}`" not in schemas_page]
        assert not absent, f"the schemas reference leaves out {name}'s columns {absent}"


def test_the_site_builds_strict_with_the_readme_as_its_home_page(tmp_path):
    """`make docs` in one test: a broken link or anchor (the README's included), a page the nav leaves out."""
    pytest.importorskip("mkdocs")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    assert "Quick start" in home and 'href="running/' in home
    for page in ("reference/config/index.html", "reference/schemas/index.html"):
        assert (tmp_path / "site" / page).is_file()
