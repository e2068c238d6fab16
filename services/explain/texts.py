"""The explain package over a log's JSON texts, as files (bytes) and the bus (str) give them.

    ids_named("train-7", texts)        # ["a1...", ...]: the jobs submitted under that name
    story_of("a1...", texts)           # the job's Entries, ready for `render`

Both `quotasched explain` and the web view's search read the log this way; no I/O here, the
caller brings the texts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from quotasched.services.explain.story import Entry, Story, mentions


class UnreadableFact(ValueError):
    """A text of the log is not a fact this version can decode."""


def ids_named(name: str, texts: Iterable[bytes | str]) -> list[str]:
    """The ids of the jobs submitted under `name`, in log order."""
    needle = json.dumps(name)
    ids = []
    for text in texts:
        line = text.decode() if isinstance(text, bytes) else text
        if '"JobSubmitted"' in line and needle in line:
            fact = json.loads(line)
            if fact.get("kind") == "JobSubmitted" and fact.get("jobName") == name:
                ids.append(fact["jobId"])
    return ids


def story_of(job_id: str, texts: Iterable[bytes | str], numbered: bool = False) -> list[Entry]:
    """The job's story; once the job has finished, only the texts that name it are decoded
    (Story.finished).  `numbered`: an unreadable text is cited by line (a file), not by its
    place in the stream."""
    from pydantic import ValidationError

    from quotasched.events.codec import decode_fact

    story = Story(job_id)
    needle = mentions(job_id)
    needle_bytes = needle.encode() if needle is not None else None
    for number, text in enumerate(texts, start=1):
        if story.finished and needle is not None:
            if (needle_bytes if isinstance(text, bytes) else needle) not in text:
                continue
        if not text.strip():
            continue
        try:
            story.add(decode_fact(text))
        except ValidationError as error:
            where = f"line {number}" if numbered else f"fact #{number}"
            raise UnreadableFact(f"{where} is not a fact this version can read: "
                                 f"{error.errors(include_url=False)[0]['msg']}") from None  # fmt: skip
    return story.close()
