"""Container image references: the grammar a job's image must follow.

A job names its image in the tag `image` or in its SageMaker payload's
`AlgorithmSpecification.TrainingImage`; the GPU agent hands it to `docker run` / `podman run`.
Only a reference of the OCI distribution grammar (github.com/distribution/reference, as the
runtimes parse it) is accepted, at submission and again before a run:

    reference  := name [":" tag] ["@" digest]
    name       := [domain "/"] path-component ["/" path-component]*      (at most 255 characters)
    domain     := host [":" port]       host: DNS labels separated by ".", or "[" IPv6 "]"
    path-component := [a-z0-9]+ (separator [a-z0-9]+)*    separator: ".", "_", "__" or "-"+
    tag        := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest     := algorithm ":" hex     algorithm: [A-Za-z][A-Za-z0-9]* joined by [-_+.]; hex: 32+

So a reference never begins with `-` (it cannot be read as a runtime option), never holds
whitespace, `=` or a quote, and its repository path is lowercase.
"""

from __future__ import annotations

import re

MAX_REFERENCE_CHARS = 512
"""A bound on the whole reference before the grammar is tried: name (255) + tag (129) + a
sha512 digest (135) fit."""

MAX_NAME_CHARS = 255  # distribution/reference's NameTotalLengthMax

_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[A-Fa-f0-9:]+\])"
_NAME = rf"(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}"
_REFERENCE = re.compile(rf"({_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?", re.ASCII)


def reference_problem(reference: object) -> str | None:
    """What is wrong with `reference` as an image reference, or None if it is one."""
    if not isinstance(reference, str):
        return f"is not a string ({type(reference).__name__})"
    if not reference:
        return "is empty"
    if len(reference) > MAX_REFERENCE_CHARS:
        return f"{_shown(reference)} is longer than {MAX_REFERENCE_CHARS} characters"
    if reference.startswith("-"):
        return (f"{_shown(reference)} begins with '-': it would be read as a container "
                "runtime option")
    # Python counts every whitespace character but the space as not printable: two C-level
    # scans instead of a generator over the characters (every submission with an image pays)
    if " " in reference or not reference.isprintable():
        return f"{_shown(reference)} holds whitespace or control characters"
    found = _REFERENCE.fullmatch(reference)
    if found is None:
        return f"{_shown(reference)} is not an image reference {_why_not(reference)}"
    if len(found.group(1)) > MAX_NAME_CHARS:
        return (f"{_shown(reference)}: the repository name is longer than {MAX_NAME_CHARS} "
                "characters")
    return None


def _shown(reference: str) -> str:
    """`reference` as a message quotes it (only a refusal pays for it)."""
    return repr(reference) if len(reference) <= 60 else repr(reference[:57]) + "..."


def _why_not(reference: str) -> str:
    """The likeliest reason, for the message (the grammar itself has decided)."""
    name = reference.split("@", 1)[0]
    path = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    first, _, rest = path.partition("/")
    repository = rest if rest and _looks_like_host(first) else path
    if repository != repository.lower():
        return "(the repository path must be lowercase)"
    return "([registry[:port]/]path[:tag][@algorithm:hex], lowercase path components)"


def _looks_like_host(first: str) -> bool:
    return "." in first or ":" in first or first == "localhost" or first != first.lower()
