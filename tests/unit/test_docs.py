"""The documentation stays honest: links resolve, commands shown exist, lists are complete."""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import typer.main
from typer.core import TyperGroup

from quotasched.events.commands import COMMAND_KINDS
from quotasched.services import asyncapi
from quotasched.services.cli.main import app
from quotasched.services.projector import api as projector_api
from quotasched.services.scheduler import api as scheduler_api
from quotasched.services.settings import Settings, StreamOptions

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
README = ROOT / "README.md"
CLI = typer.main.get_command(app)

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")
PROGRAM = re.compile(r"^(?:\S*/)?quotasched$")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    heading = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", _text(path))
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", text, re.M)}


def test_the_documentation_pages_exist():
    names = {page.name for page in PAGES}
    assert {"architecture.md", "contract.md", "executors.md", "operations.md", "scaling.md",
            "migration-aws-batch.md", "metrics.md", "service.md", "cli.md", "projections.md",
            "audit.md", "simulate.md", "guarantees.md", "performance.md", "testing.md",
            "rules.md"} <= names  # fmt: skip
    assert (DOCS / "asyncapi.yaml").exists()


@pytest.mark.parametrize("page", [*PAGES, README], ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    for target in LINK.findall(FENCE.sub("", _text(page))):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: link to {target} points at nothing"
        assert ROOT in resolved.parents or resolved == ROOT, f"{page.name}: {target} leaves the repo"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{page.name}: no heading #{anchor} in {path or page.name}"


def _other_markdown() -> list[Path]:
    """The repository's other Markdown (tests/README.md, ...), hidden folders left out."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        skip = ("docs", "node_modules", "build", "__pycache__")
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and name not in skip]
        found += [Path(folder) / name for name in files if name.endswith(".md")]
    return sorted(path for path in found if path != README)


@pytest.mark.parametrize("page", _other_markdown(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_into_the_readme_and_docs_from_elsewhere_resolve(page):
    """A section moved out of the README must not strand a link to it (tests/README.md's, say)."""
    for target in LINK.findall(FENCE.sub("", _text(page))):
        path, _, anchor = target.partition("#")
        if re.match(r"^[a-z]+:", target) or not path:
            continue
        resolved = (page.parent / path).resolve()
        if resolved != README and DOCS not in resolved.parents:
            continue
        assert resolved.exists(), f"{page.relative_to(ROOT)}: link to {target} points at nothing"
        if anchor and resolved.suffix == ".md":
            where = f"{page.relative_to(ROOT)}: no heading #{anchor} in {path}"
            assert anchor in _anchors(resolved), where


# -- the README is a front page: short, the two commands first, every page linked ---------------


def _readme_sections() -> dict[str, str]:
    """The README's `## ` sections by heading, in order, code blocks left out."""
    parts = re.split(r"^## (.+)$", FENCE.sub("", _text(README)), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_readme_begins_with_the_two_commands():
    text = _text(README)
    assert text.startswith("# quotasched\n\n```sh\n"), "README opens with its title, then commands"
    first = FENCE.search(text)
    assert first is not None and first.start() == len("# quotasched\n\n")
    commands = [line.split("#")[0].strip() for line in first.group(2).splitlines()]
    assert commands == ["make demo", "make test"]


def test_the_readme_stays_a_front_page():
    lines = _text(README).count("\n")
    assert lines < 400, f"README.md has {lines} lines: move reference material into docs/"
    sections = _readme_sections()
    for heading in ("A short tour", "Documentation", "Dependencies, and why", "Open work"):
        assert heading in sections, f"README has no section {heading!r}"
    assert list(sections)[-1] == "Open work", "Open work closes the README"
    tour = _text(README).split("## A short tour", 1)[1].split("\n## ", 1)[0]
    for shown in ("make demo", "docs/web-view.png", "quotasched explain", "quotasched sql",
                  "aws batch"):  # fmt: skip
        assert shown in tour, f"the README's tour does not show {shown}"


def test_the_readme_links_every_documentation_page():
    """From its Documentation section, each page with a line saying what is in it."""
    section = _readme_sections()["Documentation"]
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for target in LINK.findall(section)}  # fmt: skip
    for page in [*PAGES, DOCS / "asyncapi.yaml"]:
        missing = f"README's Documentation does not link {page.relative_to(ROOT)}"
        assert page.resolve() in linked, missing


def test_every_dependency_has_its_why_in_the_readme():
    """Each pin of pyproject.toml has a row in "Dependencies, and why", its version a prefix."""
    project = tomllib.loads(_text(ROOT / "pyproject.toml"))["project"]
    extras = project["optional-dependencies"].values()
    pins = [*project["dependencies"], *(pin for extra in extras for pin in extra)]
    rows = [line.split("|")[1] for line in _readme_sections()["Dependencies, and why"].splitlines()
            if line.startswith("| ") and not line.startswith("| package")]  # fmt: skip
    for pin in pins:
        requirement = re.fullmatch(r"([\w.-]+)(?:\[[\w,]+\])?==([\w.]+)", pin.split(";")[0].strip())
        assert requirement, f"pyproject.toml: {pin} is not pinned with =="
        name, version = requirement.groups()
        row_of = re.compile(rf"(?<![\w-]){re.escape(name)} ([\d.]+)(?![\w-])", re.I)
        named = [row_of.search(row) for row in rows]
        shown = [match.group(1) for match in named if match]
        assert shown, f"README's Dependencies, and why has no row for {name}"
        assert any(version == v or version.startswith(v + ".") for v in shown), (
            f"README says {name} {' / '.join(shown)}, pyproject.toml pins {version}")


# -- every `quotasched ...` shown is a real command with real options --------------------------


def _shown_commands(path: Path) -> list[str]:
    """Command lines that run quotasched, from shell code blocks and inline code."""
    text = _text(path)
    lines: list[str] = []
    for language, body in FENCE.findall(text):
        if language in ("sh", "bash", "shell", "console", ""):
            lines += body.replace("\\\n", " ").splitlines()
    lines += INLINE.findall(FENCE.sub("", text))
    shown = []
    for line in lines:
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        while tokens and re.fullmatch(r"[A-Z_]+=\S*", tokens[0]):
            tokens.pop(0)  # VAR=value before the command
        if len(tokens) < 2 or not PROGRAM.match(tokens[0]):
            continue  # not a command line, or the program's bare name
        shown.append(" ".join(tokens))
    return shown


def _check_command(shown: str) -> None:
    tokens = shlex.split(shown)[1:]
    command = CLI
    path = ["quotasched"]
    app_options = {opt for param in CLI.params for opt in (*param.opts, *param.secondary_opts)}
    if tokens and all(token in app_options for token in tokens):
        return  # the app's own options: `quotasched --version`, `--install-completion`
    while isinstance(command, TyperGroup) and tokens and tokens[0] in command.commands:
        path.append(tokens[0])
        command = command.commands[tokens.pop(0)]
    assert command is not CLI, f"`{shown}`: no such quotasched command"
    if isinstance(command, TyperGroup):
        assert tokens[:1] == ["--help"], f"`{shown}`: {' '.join(path)} needs one of {sorted(command.commands)}"
        return
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    for token in tokens:
        if token.startswith("-") and token != "-" and not token.startswith("-<"):
            option = token.split("=", 1)[0]
            assert option in known, f"`{shown}`: {' '.join(path)} has no option {option}"


DOCUMENTS = [*PAGES, README]


@pytest.mark.parametrize("page", DOCUMENTS, ids=lambda p: p.name)
def test_every_quotasched_command_shown_exists(page):
    shown = _shown_commands(page)
    for line in shown:
        _check_command(line)


def test_the_command_check_catches_a_wrong_command():
    for wrong in ("quotasched no-such-verb", "quotasched facts --no-such-option",
                  "quotasched projections", "quotasched audit verify --wrong"):  # fmt: skip
        with pytest.raises(AssertionError):
            _check_command(wrong)
    _check_command("quotasched projections rebuild --db x.duckdb --facts f.jsonl")
    assert len(_shown_commands(DOCS / "migration-aws-batch.md")) >= 10


# -- lists that must stay complete as the code grows -------------------------------------------


def test_contract_names_every_kind_and_read_verb():
    text = _text(DOCS / "contract.md")
    kinds = [*COMMAND_KINDS, *(asyncapi.kind_of(m) for m in asyncapi.fact_models())]
    verbs = [*scheduler_api.VERBS, *projector_api.VERBS]
    missing = [name for name in [*kinds, *verbs] if f"`{name}`" not in text]
    assert not missing, f"docs/contract.md does not mention {missing}"


def test_migration_guide_shows_every_operation_the_endpoint_performs():
    """Each operation the endpoint serves, as the AWS CLI spells it (botocore's own names)."""
    import botocore.session

    from quotasched.services.endpoint.operations import OPERATIONS

    text = _text(DOCS / "migration-aws-batch.md")
    model = botocore.session.get_session().get_service_model("batch")
    assert len(OPERATIONS) >= 19
    for operation in OPERATIONS:
        verb = botocore.xform_name(model.operation_model(operation).name, "-")
        assert f"`aws batch {verb}" in text, f"no `aws batch {verb}` in the migration guide"


def test_operations_lists_every_setting():
    text = _text(DOCS / "operations.md")
    names = [f"QUOTASCHED_{name.upper()}" for name in Settings.model_fields if name != "streams"]
    names += [f"QUOTASCHED_STREAM_{name.upper()}" for name in StreamOptions.model_fields]
    missing = [name for name in names if name not in text]
    assert not missing, f"docs/operations.md does not document {missing}"
