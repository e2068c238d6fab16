"""The assembled facts (`events.facts.job_submitted` and the like) are what validation builds.

The core records an accepted submission with `job_submitted`, which assembles the fact from
the validated command without validating it again (docs/performance.md).  For any valid
submission, as decoded from the wire, the result must equal `JobSubmitted(...)` built with the
same values: the same fields, the same JSON bytes, the same fields-set, and a fact that
decodes back to itself.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from quotasched.events import facts as F
from quotasched.events.codec import decode_command, decode_fact, encode, encode_bytes
from quotasched.events.values import CapacityUsage, JobStatus, StatusCause

names = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)
texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
payload_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | texts
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


@st.composite
def submissions(draw) -> dict:
    """A valid SubmitServiceJob as a pipeline would publish it, every optional field maybe."""
    message: dict = {"kind": "SubmitServiceJob", "jobName": draw(names),
                     "jobQueue": draw(names), "quotaShareName": draw(names),
                     "schedulingPriority": draw(st.integers(0, 9999))}  # fmt: skip
    if draw(st.booleans()):
        units = draw(st.lists(names, min_size=1, max_size=5, unique=True))
        message["capacityUsage"] = [{"capacityUnit": unit, "quantity": draw(st.integers(1, 64))}
                                    for unit in units]  # fmt: skip
    else:
        config = {"InstanceType": draw(names), "InstanceCount": draw(st.integers(1, 8)),
                  "Extra": draw(payload_values)}  # fmt: skip
        payload = {"ResourceConfig": config, "Other": draw(payload_values)}
        message["serviceRequestPayload"] = json.dumps(payload) if draw(st.booleans()) else payload
    optional = {
        "at": st.floats(0, 1e9) | st.integers(0, 10**6),
        "jobId": st.from_regex(r"[A-Za-z0-9_-]{1,40}", fullmatch=True),
        "clientToken": st.from_regex(r"[a-z0-9-]{1,64}", fullmatch=True),
        "tags": st.dictionaries(names.filter(lambda key: key != "image"), texts, max_size=4),  # an image tag has its grammar
        "preemptionConfiguration": st.fixed_dictionaries(
            {}, optional={"preemptionRetriesBeforeTermination": st.integers(0, 5)}),
        "retryStrategy": st.fixed_dictionaries({"attempts": st.integers(1, 10)}, optional={
            "evaluateOnExit": st.lists(st.fixed_dictionaries({
                "action": st.sampled_from(["RETRY", "EXIT", "retry"]),
                "onStatusReason": st.from_regex(r"[A-Za-z*]{1,12}", fullmatch=True)}),
                max_size=5)}),
        "timeoutConfig": st.fixed_dictionaries({"attemptDurationSeconds": st.integers(1, 10**6)}),
    }  # fmt: skip
    for field, strategy in optional.items():
        if draw(st.booleans()):
            message[field] = draw(strategy)
    return message


@settings(max_examples=300, deadline=None)
@given(message=submissions(), seq=st.integers(1, 10**9), derived=st.booleans())
def test_an_assembled_job_submitted_equals_the_validated_one(message, seq, derived) -> None:
    command = decode_command(json.dumps(message))
    at = command.at if command.at is not None else 0
    job_id = command.job_id or ("6f1c2a4e-5b7d-4c1e-9a8f-3d2b1e0c9f7a" if derived else "j")
    usage = command.capacity_usage
    if usage is None:
        usage = [CapacityUsage(capacity_unit=u, quantity=n) for u, n in command.need()]
    values = {"at": at, "command_seq": seq, "job_id": job_id, "job_queue": command.job_queue,
              "quota_share_name": command.quota_share_name, "capacity_usage": usage}  # fmt: skip
    assembled = F.job_submitted(command, **values)
    validated = F.JobSubmitted(
        **values, job_name=command.job_name, scheduling_priority=command.scheduling_priority,
        preemption_configuration=command.preemption_configuration,
        retry_strategy=command.retry_strategy, timeout_config=command.timeout_config,
        client_token=command.client_token, tags=command.tags,
        service_request_payload=command.service_request_payload,
    )  # fmt: skip
    assert type(assembled) is F.JobSubmitted
    same_fact(assembled, validated)


def same_fact(assembled, validated) -> None:
    """Equal as a model, as bytes, as a dump, in what was set by name, and through the wire."""
    assert type(assembled) is type(validated)
    assert assembled == validated
    assert encode_bytes(assembled) == encode_bytes(validated)
    assert assembled.model_fields_set == validated.model_fields_set
    assert assembled.model_dump() == validated.model_dump()
    assert decode_fact(encode(assembled)) == assembled
    assert type(assembled.at) is float


times = st.floats(0, 1e10) | st.integers(0, 10**9)  # the core's clock, float or whole
ids = st.from_regex(r"[A-Za-z0-9_-]{1,40}", fullmatch=True)
pairs = st.lists(st.tuples(names, st.integers(1, 10**6)), max_size=5, unique_by=lambda p: p[0])


@settings(max_examples=300, deadline=None)
@given(at=times, seq=st.integers(1, 10**12), job_id=ids, attempt=st.integers(0, 100),
       status=st.sampled_from(list(JobStatus)), reason=st.none() | texts,
       cause=st.sampled_from(list(StatusCause)), terminated=st.none() | st.booleans())
def test_an_assembled_job_status_changed_equals_the_validated_one(
        at, seq, job_id, attempt, status, reason, cause, terminated) -> None:
    values = {"at": at, "command_seq": seq, "job_id": job_id, "attempt": attempt,
              "status": status, "status_reason": reason, "cause": cause}  # fmt: skip
    named = values if terminated is None else {**values, "is_terminated": terminated}
    same_fact(F.job_status_changed(**named), F.JobStatusChanged(**named))


@settings(max_examples=300, deadline=None)
@given(at=times, seq=st.integers(1, 10**12), job_id=ids, attempt=st.integers(1, 100),
       queue=names, share=names, need=pairs.filter(bool), borrowed=pairs,
       victims=st.lists(ids, max_size=4))
def test_an_assembled_job_dispatched_equals_the_validated_one(
        at, seq, job_id, attempt, queue, share, need, borrowed, victims) -> None:
    values = {"at": at, "command_seq": seq, "job_id": job_id, "attempt": attempt,
              "job_queue": queue, "quota_share_name": share, "after_preemption_of": victims}
    validated = F.JobDispatched(
        **values, capacity_usage=[CapacityUsage(capacity_unit=u, quantity=n) for u, n in need],
        borrowed=[CapacityUsage(capacity_unit=u, quantity=n) for u, n in borrowed])
    assembled = F.job_dispatched(**values, capacity_usage=tuple(need), borrowed=borrowed)
    same_fact(assembled, validated)
    for made, checked in zip(assembled.capacity_usage + assembled.borrowed,
                             validated.capacity_usage + validated.borrowed):  # fmt: skip
        assert made.model_fields_set == checked.model_fields_set


@settings(max_examples=200, deadline=None)
@given(at=times, seq=st.integers(1, 10**12), job_id=ids, priority=st.integers(0, 9999))
def test_an_assembled_job_priority_updated_equals_the_validated_one(at, seq, job_id, priority):
    values = {"at": at, "command_seq": seq, "job_id": job_id, "scheduling_priority": priority}
    same_fact(F.job_priority_updated(**values), F.JobPriorityUpdated(**values))
