"""What every trace converter shares: the output schema, its checks, the sort and the tally of
dropped rows.  Standard library only, so a converter runs with any Python 3.9+:

    job_id,submit_time_s,duration_s,gpus,team,job_type

Rows are written sorted by (submit_time_s, team, job_id), one header line, "\\n" line ends,
no quoted fields (a value that would need quoting is refused), integers written as integers.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

COLUMNS = ("job_id", "submit_time_s", "duration_s", "gpus", "team", "job_type")
NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")  # quotasched's names (events/base.py NAME_PATTERN)
DAY = 86400


class ConvertError(ValueError):
    """A source that does not have the documented shape; the message names file and line."""


@dataclass(frozen=True, order=True)
class Job:
    submit_s: int
    team: str
    job_id: str
    duration_s: int
    gpus: int
    job_type: str = ""

    def row(self) -> str:
        return (f"{self.job_id},{self.submit_s},{self.duration_s},{self.gpus},{self.team},"
                f"{self.job_type}")


@dataclass
class Tally:
    """Rows read, kept, and dropped by reason (each dropped row counts once, first reason)."""

    read: int = 0
    dropped: Counter = field(default_factory=Counter)

    def drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    def lines(self, kept: int) -> list[str]:
        out = [f"rows read: {self.read:,}", f"jobs kept: {kept:,}"]
        out += [f"dropped, {reason}: {count:,}" for reason, count in sorted(self.dropped.items())]
        return out


def check_name(value: str, what: str, where: str) -> str:
    if not NAME.match(value):
        raise ConvertError(f"{where}: {what} {value!r} is not 1-128 letters, digits, '-' or '_'")
    return value


def write_jobs(jobs: Iterable[Job], path: str) -> list[Job]:
    """Sort, check and write; returns the sorted jobs.  A job_id seen twice is an error (the
    converter decides beforehand what to do with the source's duplicates)."""
    ordered = sorted(jobs)
    seen: set[str] = set()
    with open(path, "w", newline="", encoding="utf-8") as out:
        out.write(",".join(COLUMNS) + "\n")
        for job in ordered:
            if job.job_id in seen:
                raise ConvertError(f"job_id {job.job_id} appears twice")
            seen.add(job.job_id)
            if job.duration_s <= 0 or job.gpus <= 0 or job.submit_s < 0:
                raise ConvertError(f"job {job.job_id}: a kept job needs submit >= 0, duration > 0"
                                   f" and gpus > 0, got {job}")  # fmt: skip
            if job.job_type and not NAME.match(job.job_type):
                raise ConvertError(f"job {job.job_id}: job_type {job.job_type!r} needs quoting")
            out.write(job.row() + "\n")
    return ordered


def describe(jobs: list[Job]) -> list[str]:
    """The figures traces/README.md states for a trace (recomputed by the tests)."""
    if not jobs:
        return ["no jobs"]
    gpu_s = sum(j.gpus * j.duration_s for j in jobs)
    first, last = jobs[0].submit_s, jobs[-1].submit_s
    teams = Counter(j.team for j in jobs)
    sizes = Counter(j.gpus for j in jobs)
    return [
        f"jobs: {len(jobs):,}",
        f"teams: {len(teams):,}",
        f"GPU-seconds: {gpu_s:,} (GPU-hours: {gpu_s / 3600:,.0f})",
        f"submit span: {first:,} s .. {last:,} s ({(last - first) / DAY:.1f} days)",
        f"largest job: {max(sizes)} GPUs; most common sizes: "
        + ", ".join(f"{g}: {n:,}" for g, n in sizes.most_common(6)),
    ]


def report(tally: Tally, jobs: list[Job], path: str) -> None:
    print(f"wrote {path}")
    for line in tally.lines(len(jobs)) + describe(jobs):
        print("  " + line)
