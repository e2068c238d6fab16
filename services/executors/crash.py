"""Named crash points: `QUOTASCHED_CRASH_AT=<point>` makes an executor SIGKILL itself there.

A restart must cost no running job its work wherever it strikes (issue 30), and the steps
between writing an attempt down and knowing how it ended are where it is hardest.  The crash
tests, and an operator's chaos drill, kill an executor at exactly those steps instead of
hoping a `kill -9` lands there:

- `attempt-recorded`: the ledger has the attempt's pid, its command has not been let run;
- `command-started`: its command runs, RUNNING is not reported yet;
- `victim-signalled`: a preemption's SIGTERM has reached the victim, which has not exited.

Unset (the default), a point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys

def crash_point(name: str) -> None:
    """SIGKILL this process if QUOTASCHED_CRASH_AT names this point (said on stderr first)."""
    if os.environ.get("QUOTASCHED_CRASH_AT") == name:
        print(f"quotasched: crash point {name}: SIGKILL (QUOTASCHED_CRASH_AT)", file=sys.stderr,
              flush=True)  # fmt: skip
        os.kill(os.getpid(), signal.SIGKILL)
