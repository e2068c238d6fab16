"""The documentation stays honest: links resolve, commands shown exist, lists are complete."""

from __future__ import annotations

import re
import shlex
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
            "migration-aws-batch.md"} <= names  # fmt: skip
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


def test_the_readme_links_every_documentation_page():
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for target in LINK.findall(_text(README))}  # fmt: skip
    for page in [*PAGES, DOCS / "asyncapi.yaml"]:
        assert page.resolve() in linked, f"README does not link {page.relative_to(ROOT)}"


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
