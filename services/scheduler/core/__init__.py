"""The pure decision core: AWS Batch quota management as `decide` and `evolve`.

Nothing in this package performs I/O, reads a clock, draws random numbers or logs.  The
service, `quotasched replay`, the simulator, the audit and the tests all drive it.
"""

from services.scheduler.core.decision import catch_up_clock, decide, reject, reject_undecodable, step, step_raw
from services.scheduler.core.evolve import evolve, fold
from services.scheduler.core.state import State
from services.scheduler.core.views import state_document

__all__ = ["State", "catch_up_clock", "decide", "evolve", "reject", "reject_undecodable", "fold", "state_document", "step", "step_raw"]
