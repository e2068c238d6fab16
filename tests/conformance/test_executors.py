"""The conformance kit (kit.py) over the four built-in executors (targets.py): one real
nats-server, scheduler and executor per executor (a class-scoped stack), fresh quota shares
per scenario.  A scenario an executor cannot take part in is skipped with its reason, from the
executor's description (docs/executors.md, "Conformance kit", has the table)."""

from __future__ import annotations

import pytest

from tests.conformance.kit import conformance_tests
from tests.conformance.targets import AgentTarget, ProcessTarget, SageMakerTarget, SimulatedTarget

pytestmark = [pytest.mark.nats]

TestSimulatedTarget = conformance_tests(SimulatedTarget)
TestProcessTarget = conformance_tests(ProcessTarget)
TestSageMakerTarget = conformance_tests(SageMakerTarget)
TestAgentTarget = conformance_tests(AgentTarget)
