"""The pure decision core: AWS Batch quota management as `decide` and `evolve`.

Nothing in this package performs I/O, reads a clock, draws random numbers or logs.  The
service, `quotasched replay`, the simulator, the audit and the tests all drive it.

The same modules may run compiled with mypyc (`python -m quotasched.services.native build`): when a
build of exactly these sources exists, its folder comes first on this package's search path,
so every `services.scheduler.core.*` import loads the extension instead.  `COMPILED` says
which it is, `CORE_BUILD` why (services/native.py).
"""

from quotasched.services import native as _native

COMPILED, CORE_BUILD = _native.state()
if COMPILED:
    __path__.insert(0, str(_native.DIRECTORY))

from quotasched.services.scheduler.core.decision import catch_up_clock, decide, reject, reject_undecodable, step, step_raw  # noqa: E402
from quotasched.services.scheduler.core.evolve import evolve, fold  # noqa: E402
from quotasched.services.scheduler.core.state import State  # noqa: E402
from quotasched.services.scheduler.core.views import state_document  # noqa: E402

__all__ = ["COMPILED", "CORE_BUILD", "State", "catch_up_clock", "decide", "evolve", "reject", "reject_undecodable", "fold", "state_document", "step", "step_raw"]
