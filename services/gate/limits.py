"""What the admission gate lets through, per quota share: pure, with the time given.

The decision core counts a share's submissions exactly, in stream time, and refuses what is
over its limits (services/scheduler/core/limits.py).  But a refused command has already been
stored, and is decided in the one command stream's order: a team that floods makes every other
team wait behind its refusals.  The gate applies the same limits before the stream, on its own
clock, so a flood beyond them never enters it:

- a share's `SubmitServiceJob`s: at most `maxSubmissionsPerSecond` in one whole second, and at
  most `maxSubmissionBytesPerWindow` counted bytes (`counted_bytes`: a submission over 16 KiB)
  in one window of `submissionBytesWindowSeconds`, as the core counts them;
- a share's `UpdateServiceJob`s and `TerminateServiceJob`s: each kind at most
  `maxSubmissionsPerSecond` in one whole second (the core does not limit them; the gate does,
  or a team could flood with them instead).

The core stays the authority: what the gate lets through is decided there, exactly.  The gate
only keeps out what the core would refuse anyway (its second and the stream's differ by the
time a message takes to be stored, so near a second's edge the core may still refuse a few).
`maxQueuedJobs` is not checked here: it needs the share's jobs, which only the core has; the
per-second limit bounds what such refusals can cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quotasched.events.subjects import GATED_COMMANDS
from quotasched.events.values import ADMISSION_DEFAULTS, QuotaShareOptions
from quotasched.services.scheduler.core.limits import counted_bytes

THROTTLED = 429  # the gate's error code for a command over its share's limits (HTTP's)
REFUSED = 400  # ... for a subject that is no share's job command
GATE_ERROR_CODES = (THROTTLED, REFUSED)  # as `err_code` too: JetStream's own are 10000 and up

_KINDS = {kind: index for index, kind in enumerate(GATED_COMMANDS)}  # submissions first


@dataclass(frozen=True)
class ShareLimits:
    per_second: int = ADMISSION_DEFAULTS["max_submissions_per_second"]
    window_seconds: int = ADMISSION_DEFAULTS["submission_bytes_window_seconds"]
    window_bytes: int = ADMISSION_DEFAULTS["max_submission_bytes_per_window"]

    @classmethod
    def of(cls, options: QuotaShareOptions) -> ShareLimits:
        return cls(options.admission("max_submissions_per_second"),
                   options.admission("submission_bytes_window_seconds"),
                   options.admission("max_submission_bytes_per_window"))  # fmt: skip


DEFAULT_LIMITS = ShareLimits()


@dataclass
class _Counts:
    second: int = -1
    sent: list[int] = field(default_factory=lambda: [0, 0, 0])  # per kind, in `second`
    window: int = -1
    window_bytes: int = 0


class Gate:
    """Per share (job queue, quota share), what was let through in the current second and
    byte window; `admit` answers one command.  Bounded: a share's counts are dropped when its
    second has passed and it has no bytes in an open window (`forget`)."""

    def __init__(self) -> None:
        self.limits: dict[tuple[str, str], ShareLimits] = {}
        self._counts: dict[tuple[str, str], _Counts] = {}

    def set_limits(self, share: tuple[str, str], options: QuotaShareOptions | None) -> None:
        """A share's limits from its options (None: the defaults)."""
        if options is None:
            self.limits.pop(share, None)
        else:
            self.limits[share] = ShareLimits.of(options)

    def admit(self, share: tuple[str, str], kind: str, size: int, now: float) -> str | None:
        """Count a command of `kind` and `size` bytes for `share` at `now` (seconds) if it is
        within the share's limits and return None; else why not (naming the limit), uncounted."""
        index = _KINDS.get(kind)
        if index is None:
            return (f"{kind} is not a job command of one quota share (the gate forwards "
                    f"{', '.join(_KINDS)} only)")  # fmt: skip
        limits = self.limits.get(share, DEFAULT_LIMITS)
        counts = self._counts.get(share)
        if counts is None:
            counts = self._counts[share] = _Counts()
        second = int(now // 1)
        if counts.second != second:
            counts.second, counts.sent = second, [0, 0, 0]
        if counts.sent[index] >= limits.per_second:
            what = "submissions" if index == 0 else f"{kind} commands"
            return (f"Quota share {share[1]} already had {counts.sent[index]} {what} in this "
                    f"second, its limit maxSubmissionsPerSecond of {limits.per_second}")
        charge = counted_bytes(size) if index == 0 else None
        if charge is not None:
            window = int(now // limits.window_seconds)
            if counts.window != window:
                counts.window, counts.window_bytes = window, 0
            if counts.window_bytes + charge > limits.window_bytes:
                return (f"Quota share {share[1]} would reach {counts.window_bytes + charge} "
                        f"submission bytes in this {limits.window_seconds}-second window, over "
                        f"its limit maxSubmissionBytesPerWindow of {limits.window_bytes}")
            counts.window_bytes += charge
        counts.sent[index] += 1
        return None

    def forget(self, now: float) -> int:
        """Drop the counts that can no longer refuse anything; how many were dropped."""
        second = int(now // 1)
        stale = [share for share, counts in self._counts.items()
                 if counts.second < second and (counts.window_bytes == 0 or counts.window < int(
                     now // self.limits.get(share, DEFAULT_LIMITS).window_seconds))]  # fmt: skip
        for share in stale:
            del self._counts[share]
        return len(stale)

    def __len__(self) -> int:
        return len(self._counts)
