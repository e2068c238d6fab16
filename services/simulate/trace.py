"""Job traces: the CSV format of `traces/README.md`, read and checked, and a seeded generator.

    job_id,submit_time_s,duration_s,gpus,team,job_type

A trace is held column-wise (one list per column), which is what the simulator's loop reads
and costs a fraction of one object per job.  Every row is checked: a bad row is a
`TraceError` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass, field

from quotasched.events.base import NAME_PATTERN

COLUMNS = ("job_id", "submit_time_s", "duration_s", "gpus", "team", "job_type")
REQUIRED = COLUMNS[:5]


class TraceError(ValueError):
    """A trace file that cannot be simulated, with the line and column at fault."""


@dataclass
class Trace:
    job_ids: list[str] = field(default_factory=list)
    submit: list[float] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    team: list[str] = field(default_factory=list)
    job_type: list[str] = field(default_factory=list)
    source: str = "<memory>"

    def __len__(self) -> int:
        return len(self.job_ids)

    def append(self, job_id: str, submit: float, duration: float, gpus: int, team: str,
               job_type: str = "") -> None:  # fmt: skip
        self.job_ids.append(job_id)
        self.submit.append(submit)
        self.duration.append(duration)
        self.gpus.append(gpus)
        self.team.append(team)
        self.job_type.append(job_type)

    def head(self, count: int) -> Trace:
        """The first `count` jobs (by submission), e.g. for a linearity check."""
        return Trace(self.job_ids[:count], self.submit[:count], self.duration[:count],
                     self.gpus[:count], self.team[:count], self.job_type[:count],
                     f"{self.source} (first {count} jobs)")  # fmt: skip

    def teams(self) -> list[str]:
        return sorted(set(self.team))

    def gpu_seconds(self) -> float:
        return sum(d * g for d, g in zip(self.duration, self.gpus))


def _number(text: str, where: str, column: str, integer: bool, positive: bool) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise TraceError(f"{where}: {column} must be {kind}, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise TraceError(f"{where}: {column} must be finite, got {text!r}")
    if positive and value <= 0:
        raise TraceError(f"{where}: {column} must be > 0, got {text!r}")
    if not positive and value < 0:
        raise TraceError(f"{where}: {column} must be >= 0, got {text!r}")
    return value


def read_trace(path: str) -> Trace:
    """Read and check a trace CSV; rows are put in submission order (stable)."""
    import re

    name_ok = re.compile(NAME_PATTERN).match
    try:
        handle = open(path, newline="", encoding="utf-8")
    except OSError as error:
        raise TraceError(f"cannot read trace {path}: {error.strerror or error}") from None
    trace = Trace(source=path)
    seen: set[str] = set()
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError(f"{path}: empty file; expected the header {','.join(COLUMNS)}")
        header = [column.strip() for column in header]
        missing = [column for column in REQUIRED if column not in header]
        if missing:
            raise TraceError(f"{path}:1: header lacks {', '.join(missing)}; "
                             f"expected {','.join(COLUMNS)}")  # fmt: skip
        at = {column: header.index(column) for column in header if column in COLUMNS}
        i_id, i_sub, i_dur, i_gpu, i_team = (at[c] for c in REQUIRED)
        i_type = at.get("job_type")
        width = len(header)
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            where = f"{path}:{line}"
            if len(row) != width:
                raise TraceError(f"{where}: {len(row)} fields, the header has {width}")
            job_id, team = row[i_id], row[i_team]
            if not name_ok(job_id):
                raise TraceError(f"{where}: job_id {job_id!r} must be 1-128 characters of "
                                 "letters, digits, hyphens and underscores")  # fmt: skip
            if job_id in seen:
                raise TraceError(f"{where}: job_id {job_id} appears twice")
            seen.add(job_id)
            if not team:
                raise TraceError(f"{where}: team is empty")
            trace.append(
                job_id,
                float(_number(row[i_sub], where, "submit_time_s", False, False)),
                float(_number(row[i_dur], where, "duration_s", False, True)),
                int(_number(row[i_gpu], where, "gpus", True, True)),
                team,
                row[i_type] if i_type is not None else "",
            )  # fmt: skip
    if not trace.job_ids:
        raise TraceError(f"{path}: no jobs after the header")
    return _sorted(trace)


def _sorted(trace: Trace) -> Trace:
    submit = trace.submit
    if all(submit[i] <= submit[i + 1] for i in range(len(submit) - 1)):
        return trace
    order = sorted(range(len(submit)), key=submit.__getitem__)
    out = Trace(source=trace.source)
    for i in order:
        out.append(trace.job_ids[i], submit[i], trace.duration[i], trace.gpus[i],
                   trace.team[i], trace.job_type[i])  # fmt: skip
    return out


def write_trace(trace: Trace, path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in zip(trace.job_ids, trace.submit, trace.duration, trace.gpus, trace.team,
                       trace.job_type):  # fmt: skip
            job_id, submit, duration, gpus, team, job_type = row
            writer.writerow((job_id, _plain(submit), _plain(duration), gpus, team, job_type))


def _plain(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def synthetic(jobs: int, *, teams: int = 3, seed: int = 0, mean_gap_s: float = 60.0,
              job_types: tuple[str, ...] = ("prod", "dev")) -> Trace:  # fmt: skip
    """A small seeded trace shaped like the ITP one: mostly 1-GPU jobs, some 2-16, log-normal
    durations, Poisson arrivals, skewed team popularity.  Same arguments, same trace."""
    rng = random.Random(seed)
    names = [f"team{index + 1}" for index in range(teams)]
    weights = [1.0 / (index + 1) for index in range(teams)]
    sizes, size_weights = (1, 2, 4, 8, 16), (80, 4, 6, 8, 2)
    trace = Trace(source=f"synthetic(jobs={jobs}, teams={teams}, seed={seed})")
    now = 0.0
    for index in range(jobs):
        now += round(rng.expovariate(1.0 / mean_gap_s))
        duration = max(1, round(rng.lognormvariate(7.0, 1.2)))
        trace.append(
            f"job-{index:06d}", float(now), float(duration),
            rng.choices(sizes, size_weights)[0], rng.choices(names, weights)[0],
            rng.choice(job_types) if job_types else "",
        )  # fmt: skip
    return trace
