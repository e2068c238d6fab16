"""The live web view (`quotasched up` prints `WEB=http://127.0.0.1:PORT`): a read-only page on
loopback showing, per job queue, each share's usage against its limit per capacity unit (with
borrowed capacity and who lent it), each share's waiting jobs in dispatch order and why each
waits (paged), recent dispatches, preemptions and ends, instances in use over time as step
lines, and a job's story (`explain`) with its attempts; jobs read by name
(`events.labels`).  The server renders the first state into the page; then it updates by
server push (Server-Sent Events, `GET /api/events`): the server follows the fact log and
pushes one small event per fact; the page re-fetches the JSON that fact affects.

Every answer comes from the existing read APIs over NATS (the scheduler's `qm.api.*`, the
projector's `qm.proj.*`) and the fact log: the view keeps no copy of the state.  `server` is
the HTTP side (aiohttp, on the stack's event loop, like the AWS Batch endpoint), `answers`
shapes the JSON the page reads, `usage` the step lines, `render` the first state's HTML,
`follow` follows the log and fans events out, `search` reads a job's story, `screenshot`
takes the README's picture.  The page and its vendored charting library (Chart.js, see
static/vendor/PROVENANCE) are in `static/`.
"""

from quotasched.services.web.server import WebError, WebView

__all__ = ["WebError", "WebView"]
