"""Admission limits: how much one quota share may submit (issue 29; an option beyond AWS).

A team must not be able to flood the service.  Each share has three limits, set with
`SetQuotaShareOptions` and defaulting (values.ADMISSION_DEFAULTS) when not set:

- queued jobs: the share's jobs not yet ended (RUNNABLE or dispatched) at most
  `maxQueuedJobs`;
- submissions per second: at most `maxSubmissionsPerSecond` accepted in one whole second of
  logical time, `[floor(at), floor(at) + 1)`;
- submission bytes: at most `maxSubmissionBytesPerWindow` bytes of accepted submissions in one
  window `[k * W, (k + 1) * W)` of `W = submissionBytesWindowSeconds`.  A submission's bytes are
  its message's size as the core received it (`step(..., size=)`), counted only above
  `BYTES_COUNTED_ABOVE`; the JobSubmitted fact then records them (`commandBytes`), so the
  fold of the log, the live service, replay and the audit count the same.

Windows are fixed, not sliding: two integers per share, O(1) to check and fold.  A submission
over a limit is refused before anything else is done with it, with a CommandRejected naming
the limit; refusals do not count, so a share is accepted again as soon as it is back under
its limits (its jobs end, the next second, the next window).  Counts come only from facts
(`counted` is called by evolve), so a recovered scheduler counts exactly as the live one.
"""

from __future__ import annotations

from quotasched.events.values import QuotaShareOptions
from quotasched.services.scheduler.core.entities import Share

BYTES_COUNTED_ABOVE = 16 * 1024
"""Submissions up to this size count 0 bytes (their number is limited per second); every
example and ordinary submission is far smaller, so their facts stay as they were."""

_DEFAULT = QuotaShareOptions()


def options_of(share: Share) -> QuotaShareOptions:
    return _DEFAULT if share.options is None else share.options.options


def counted_bytes(size: int) -> int | None:
    """The bytes a submission of `size` bytes counts (None: none, and none recorded)."""
    return size if size > BYTES_COUNTED_ABOVE else None


Limits = tuple[int, int, int, int]
"""(maxQueuedJobs, submissionBytesWindowSeconds, maxSubmissionsPerSecond,
maxSubmissionBytesPerWindow) as they apply to a share."""


def _resolve(options: QuotaShareOptions) -> Limits:
    return (options.admission("max_queued_jobs"),
            options.admission("submission_bytes_window_seconds"),
            options.admission("max_submissions_per_second"),
            options.admission("max_submission_bytes_per_window"))  # fmt: skip


_DEFAULT_LIMITS = _resolve(_DEFAULT)


# Limits resolved per options fact (id -> (the fact, its limits)): a share's options change
# rarely and every submission asks.  Invisible to the decisions: the same fact, the same limits.
_RESOLVED: dict[int, tuple[object, Limits]] = {}
_MOST_RESOLVED = 4096


def limits_of(share: Share) -> Limits:
    """The share's admission limits; a share without options (most) costs one test, since
    every submission asks (issue 34: a check with nothing to do costs nothing measurable)."""
    fact = share.options
    if fact is None:
        return _DEFAULT_LIMITS
    hit = _RESOLVED.get(id(fact))
    if hit is not None and hit[0] is fact:
        return hit[1]
    if len(_RESOLVED) >= _MOST_RESOLVED:
        _RESOLVED.clear()
    limits = _resolve(fact.options)
    _RESOLVED[id(fact)] = (fact, limits)
    return limits


def refusal(share: Share, at: float, size: int) -> str | None:
    """Why a submission to `share` at `at` of `size` bytes would pass a limit, if it would."""
    most_queued, seconds, per_second, most_bytes = limits_of(share)
    if share.live >= most_queued:
        return (f"Quota share {share.name} has {share.live} queued jobs, its limit "
                       f"maxQueuedJobs of {most_queued}; submit again when some have ended")
    counts = share.submissions
    if counts and counts[1] >= per_second and counts[0] == int(at // 1):
        return (f"Quota share {share.name} already had {counts[1]} submissions in this "
                       f"second, its limit maxSubmissionsPerSecond of {per_second}")
    charge = counted_bytes(size)
    if charge is None:
        return None
    used = _counts_at(share, at, seconds)[3]
    most = most_bytes
    if used + charge > most:
        return (f"Quota share {share.name} would reach {used + charge} submission bytes in "
                       f"this {seconds}-second window, over its limit maxSubmissionBytesPerWindow "
                       f"of {most}")
    return None


def counted(share: Share, at: float, command_bytes: int | None) -> tuple:
    """The share's counts (second, submissions in it, window, bytes in it) once a submission
    at `at` of `command_bytes` counted bytes is accepted."""
    now, submitted, window, used = _counts_at(share, at, limits_of(share)[1])
    return now, submitted + 1, window, used + (command_bytes or 0)


def _counts_at(share: Share, at: float, seconds: int) -> tuple[int, int, int, int]:
    """(second, submissions in it, bytes window, bytes in it) as they stand at `at`: what
    the share counted, or nothing where `at` is in a later second or window."""
    second, submitted, window, used = share.submissions or (None, 0, None, 0)
    now, this_window = int(at // 1), int(at // seconds)
    return (now, submitted if second == now else 0, this_window,
            used if window == this_window else 0)  # fmt: skip
