"""Checkpoints in a simulation: which jobs save their work, how often, what a restart costs.

A job checkpoints every `interval` seconds of each attempt's own run time (0: never).  Its
interval comes from, first to last: its team's class, its job_type's class, the class of the
largest `gpus_at_least` it reaches, the configuration's `checkpoint_interval_s`.  A preempted
attempt keeps the work up to its last checkpoint; the job's next attempt first spends the
restart overhead (reloading, warming up: work redone) and then runs the work left.  The
overhead is paid by jobs that checkpoint only: a job that never does restarts from zero, as
it always did, so an unset interval changes nothing.

Accounting (engine.py `_stop`), for a preempted attempt that ran t seconds, began with r
seconds of overhead (0 on a first attempt) and last checkpointed at c (the largest multiple of
the interval <= t): the job's work kept is max(0, c - r), and

    lost = t - kept - r + o

where o is the overhead its next attempt pays, charged to the preemption that causes it (r
was charged to the previous one, so a reload cut short is not charged twice).  Summed over a
job that finishes, lost = its attempts' run time - its duration.  "Without checkpoints" is the
same run's preempted attempts counted whole (the simulator's figure before checkpoints, and
still its figure when no job checkpoints): this schedule's loss, not that of a run without
checkpoints, whose resumed attempts would run longer and be preempted differently.

On the command line (`--checkpoint-interval`, repeatable): `1h` for every job, or a class:
`team=cluster03:30m`, `job_type=prod:2h`, `gpus>=8:4h`; `0` turns checkpoints off.  Durations
are seconds, or a number with s, m, h or d, as for --window.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from quotasched.services.simulate.config import CheckpointClass, ConfigError, SimConfig
from quotasched.services.simulate.trace import Trace
from quotasched.services.simulate.window import UNIT_S, span_words

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)")
_CLASS = re.compile(r"(team|job_type)=(.*)|gpus>=(.*)")
SYNTAX = "DURATION, team=NAME:DURATION, job_type=NAME:DURATION or gpus>=N:DURATION"
LISTED = 12  # names listed in an error before "..."


class CheckpointError(ValueError):
    """A checkpoint option that cannot be used; the message names the option and the problem."""


def parse_duration(text: str, option: str, spec: str | None = None) -> float:
    """Seconds from `90`, `30m`, `1.5h`, `2d`; otherwise an error naming `option` and the
    `spec` the duration is part of (default: the duration itself)."""
    where = f"{option} {text if spec is None else spec}"
    stripped = text.strip()
    if stripped.startswith("-"):
        raise CheckpointError(f"{where}: a duration must not be negative")
    match = _DURATION.fullmatch(stripped)
    if match is None:
        raise CheckpointError(f"{where}: {stripped!r} is not a duration: seconds, or a number "
                              "with s, m, h or d (e.g. 90, 30m, 1.5h)")  # fmt: skip
    seconds = float(match.group(1)) * UNIT_S[match.group(2)]
    if not math.isfinite(seconds):
        raise CheckpointError(f"{where}: too large")
    return seconds


@dataclass(frozen=True)
class CheckpointOptions:
    """What the command line says about checkpoints, laid over every configuration run."""

    interval_s: float | None = None  # every job's; None: the configuration's; 0: none
    overhead_s: float | None = None  # None: the configuration's
    classes: tuple[CheckpointClass, ...] = ()

    def apply(self, config: SimConfig) -> SimConfig:
        """`config` with these options: the global interval and the overhead replace its own,
        a class replaces its class of the same team, job_type or size, and adds to the rest."""
        update: dict = {}
        if self.interval_s is not None:
            update["checkpoint_interval_s"] = self.interval_s or None
        if self.overhead_s is not None:
            update["checkpoint_overhead_s"] = self.overhead_s
        if self.classes:
            given = {kind.selector for kind in self.classes}
            kept = [kind for kind in config.checkpoint_classes if kind.selector not in given]
            update["checkpoint_classes"] = [*kept, *self.classes]
        return config.model_copy(update=update) if update else config


def parse_options(intervals: list[str] | None, overhead: str | None) -> CheckpointOptions:
    """`--checkpoint-interval` (each SPEC) and `--checkpoint-overhead`, checked; one global
    interval and one interval per class at most."""
    option = "--checkpoint-interval"
    interval_s: float | None = None
    given = ""
    classes: dict[str, CheckpointClass] = {}
    for spec in intervals or []:
        head, colon, tail = spec.rpartition(":")
        if not colon:
            if interval_s is not None:
                raise CheckpointError(f"{option} {spec}: every job's interval is already given "
                                      f"({given})")  # fmt: skip
            interval_s, given = parse_duration(spec, option), spec
            continue
        kind = _class(spec, head, parse_duration(tail, option, spec))
        if kind.selector in classes:
            raise CheckpointError(f"{option} {spec}: {kind.selector} is given twice")
        classes[kind.selector] = kind
    overhead_s = parse_duration(overhead, "--checkpoint-overhead") if overhead else None
    return CheckpointOptions(interval_s, overhead_s, tuple(classes.values()))


def _class(spec: str, head: str, interval_s: float) -> CheckpointClass:
    match = _CLASS.fullmatch(head.strip())
    if match is None:
        raise CheckpointError(f"--checkpoint-interval {spec}: expected {SYNTAX}")
    key, name, size = match.groups()
    if key is not None:
        if not name.strip():
            raise CheckpointError(f"--checkpoint-interval {spec}: {key} names nothing")
        return CheckpointClass(**{key: name.strip(), "interval_s": interval_s})
    if not size.strip().isdigit() or int(size) < 1:
        raise CheckpointError(f"--checkpoint-interval {spec}: gpus>= takes a whole number of "
                              f"GPUs, at least 1, not {size.strip()!r}")  # fmt: skip
    return CheckpointClass(gpus_at_least=int(size), interval_s=interval_s)


def _names(values: list[str]) -> str:
    shown = ", ".join(values[:LISTED])
    return shown + (", ..." if len(values) > LISTED else "")


def job_intervals(config: SimConfig, trace: Trace) -> list[float]:
    """Each job's checkpoint interval in seconds (0: it never checkpoints), indexed like the
    trace; a class naming a team or job_type that no job has is an error (a typo, most likely,
    that would silently change nothing)."""
    default = config.checkpoint_interval_s or 0.0
    if not config.checkpoint_classes:
        return [default] * len(trace)
    teams = {k.team: k.interval_s for k in config.checkpoint_classes if k.team is not None}
    types = {k.job_type: k.interval_s for k in config.checkpoint_classes if k.job_type is not None}
    sizes = sorted(((k.gpus_at_least, k.interval_s) for k in config.checkpoint_classes
                    if k.gpus_at_least is not None), reverse=True)  # fmt: skip
    present = set(trace.team)
    for team in teams:
        if team not in present:
            raise ConfigError(f"{config.name}: checkpoint interval for team {team}: no job of "
                              f"the trace has that team (its teams: "
                              f"{_names(sorted(present))})")  # fmt: skip
    kinds = set(trace.job_type)
    for kind in types:
        if kind not in kinds:
            known = sorted(k for k in kinds if k)
            said = f"its job types: {_names(known)}" if known else "its job_type column is empty"
            raise ConfigError(f"{config.name}: checkpoint interval for job_type {kind}: no job "
                              f"of the trace has that job_type ({said})")  # fmt: skip
    out = []
    for team, kind, gpus in zip(trace.team, trace.job_type, trace.gpus):
        interval = teams.get(team)
        if interval is None:
            interval = types.get(kind)
        if interval is None:
            interval = next((seconds for least, seconds in sizes if gpus >= least), default)
        out.append(interval)
    return out


def describe(config: SimConfig) -> str:
    """'every 1 h; team=cluster03 every 30 min; restart overhead 5 min', or 'none'."""
    parts = []
    if config.checkpoint_interval_s:
        parts.append(f"every {span_words(config.checkpoint_interval_s)}")
    for kind in config.checkpoint_classes:
        every = f"every {span_words(kind.interval_s)}" if kind.interval_s else "never"
        parts.append(f"{kind.selector} {every}")
    if not parts or not (config.checkpoint_interval_s
                         or any(k.interval_s for k in config.checkpoint_classes)):  # fmt: skip
        return "none"
    if config.checkpoint_overhead_s:
        parts.append(f"restart overhead {span_words(config.checkpoint_overhead_s)}")
    return "; ".join(parts)
