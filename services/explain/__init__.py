"""`quotasched explain JOB_ID`: a job's story in plain sentences, each backed by the log.

The facts are folded with the core's own `evolve`, one command at a time, and the reasons are
read off the state at each moment with the core's own arithmetic (`accounting.contribution`,
`admission.blocked_reason`, the victim orderings of `ordering.py`):

- what happened to the job: submitted, priority changes, dispatched (attempt, what it borrowed
  and from whose idle capacity), preempted (by whom, which rule, every share's usage and limit
  right before, and why this job was the victim), requeued or failed, finished;
- why it waited: after its submission and after every command that touched its job queue,
  while it is RUNNABLE, the core's answer (`scheduler.core.waiting`, the one the web view,
  the queue snapshot and the metric show) is asked again, and told whenever it changes: behind a
  higher-priority or earlier job of its share (naming the head, and why the head waits), a
  blocked head (the exact reason string), the share at its own limit and not allowed to borrow,
  the borrow ceiling reached, no idle lendable capacity in the other shares (naming them with
  their usage and limits), the service environment full or DISABLED; under the queue's
  options beyond AWS, a share group's maxCapacity, and the order borrowers are served in (a
  group lending inside first, fair share's decayed borrowing per weight), also when another
  borrower was dispatched ahead of the job.

Every sentence cites the `commandSeq` and `at` of the facts it comes from; a "Waiting" entry
cites the command after which the state it describes held.  No I/O here: the caller brings
the facts (a file, the bus, a replay).

The package, by concept: `story` (gathering: folding the facts, telling what concerns the job,
and rendering the story), `sentences` (the wording of each fact), `waiting` (why a job waits,
as the core says it), `contexts` (usage and victims read right before a fact), `queue_options`
(the borrowers a dispatch went before or passed over).  This module is the public face: every
name importers use is here.
"""

from quotasched.services.explain.story import (
    WAITING,
    Entry,
    InconsistentLog,
    Story,
    explain,
    mentions,
    render,
)
from quotasched.services.explain.texts import UnreadableFact, ids_named, story_of
from quotasched.services.explain.waiting import why_waiting

__all__ = ["WAITING", "Entry", "InconsistentLog", "Story", "UnreadableFact", "explain", "ids_named",
           "mentions", "render", "story_of", "why_waiting"]
