"""ListServiceJobs from the projection pages as the scheduler's does (issue 29 point 1):
`maxResults` 1-1000 (default 100), an opaque `nextToken` (a keyset cursor), filters bounded
as the scheduler bounds them, and answers that fit one NATS message.  Against a DuckDB file
projected from a random workload, read through a read-only connection as `quotasched
projections query` reads it."""

from __future__ import annotations

import base64
import json

import pytest

from quotasched.projections import queries, store
from quotasched.services.projector import api as projector_api
from quotasched.services.scheduler import api
from tests.projections.helpers import project
from tests.projections.test_queries import replayed, requests


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    """The scheduler's final state of a random workload, and its projection in a file."""
    state, facts = replayed("random-1")
    path = str(tmp_path_factory.mktemp("paging") / "projection.duckdb")
    project(facts, path).close()
    with store.open(path, read_only=True) as projection:
        yield state, projection.con


def pages(con, request: dict, max_bytes: int | None = None) -> list[dict]:
    """Every page of a listing, following `nextToken` (each page a fresh request)."""
    found, token = [], None
    while True:
        asked = {**request, **({"nextToken": token} if token else {})}
        page = (queries.list_service_jobs(con, asked) if max_bytes is None
                else queries.list_service_jobs(con, asked, max_bytes=max_bytes))  # fmt: skip
        found.append(page)
        token = page.get("nextToken")
        if token is None:
            return found
        assert len(found) < 10_000, "paging does not end"


def newest_first(state, queue: str) -> list[str]:
    """The queue's jobs as the scheduler lists them: newest (last accepted) first."""
    return [job.job_id for job in reversed(state.jobs.values()) if job.queue == queue]


@pytest.mark.parametrize("size", [5, 100, 1000, None])
def test_every_job_appears_once_across_pages_newest_first(workload, size):
    state, con = workload
    request = {"jobQueue": "q", "jobStatus": "ALL"}
    if size is not None:
        request["maxResults"] = size
    listed = pages(con, request)
    ids = [job["jobId"] for page in listed for job in page["jobSummaryList"]]
    expected = newest_first(state, "q")
    assert len(expected) > 200  # enough for several default pages
    assert ids == expected
    assert all(len(page["jobSummaryList"]) == (size or 100) for page in listed[:-1])
    created = [job["createdAt"] for page in listed for job in page["jobSummaryList"]]
    assert created == sorted(created, reverse=True)


def test_a_filtered_listing_pages_to_the_scheduler_s_list(workload):
    state, con = workload
    request = {"jobQueue": "q", "jobStatus": "ALL", "maxResults": 5,
               "filters": [{"name": "JOB_NAME", "values": ["n1*", "N2*"]}]}  # fmt: skip
    ids = [job["jobId"] for page in pages(con, request) for job in page["jobSummaryList"]]
    expected = [job_id for job_id in newest_first(state, "q")
                if state.jobs[job_id].job_name.lower().startswith(("n1", "n2"))]  # fmt: skip
    assert ids == expected and len(ids) > 5


def test_a_page_is_cut_to_fit_the_answer_limit_and_the_rest_follows(workload):
    state, con = workload
    listed = pages(con, {"jobQueue": "q", "jobStatus": "ALL", "maxResults": 1000},
                   max_bytes=api.ANSWER_RESERVE_BYTES + 20_000)  # fmt: skip
    assert len(listed) > 2
    for page in listed:
        assert len(json.dumps(page["jobSummaryList"]).encode()) <= 20_000
    ids = [job["jobId"] for page in listed for job in page["jobSummaryList"]]
    assert ids == newest_first(state, "q")


def test_the_projection_pages_where_the_scheduler_pages(workload):
    """The one difference from the scheduler: what the token says (each its own numbering);
    whether there is a next page is the same."""
    state, con = workload
    listings = [request for verb, request in requests(state) if verb == "list-service-jobs"]
    assert any("nextToken" in api.answer(state, "list-service-jobs", r) for r in listings)
    for request in listings:
        verb = "list-service-jobs"
        expected = api.answer(state, verb, request)
        got = queries.answer(con, verb, request)
        assert ("nextToken" in got) == ("nextToken" in expected), (verb, request)
        expected.pop("nextToken", None)
        got.pop("nextToken", None)
        assert got == expected, (verb, request)


def _token(document: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).decode()


@pytest.mark.parametrize("request_, words", [
    ({"maxResults": 0}, "maxResults must be an integer from 1 to 1000, not 0"),
    ({"maxResults": 1001}, "maxResults must be an integer from 1 to 1000, not 1001"),
    ({"maxResults": "10"}, "maxResults must be an integer from 1 to 1000"),
    ({"maxResults": True}, "maxResults must be an integer from 1 to 1000"),
    ({"nextToken": "not a token"}, "nextToken is not one the projection gave"),
    ({"nextToken": _token({"before": 5})}, "nextToken is not one the projection gave"),
    ({"nextToken": _token({"submittedBefore": "5"})}, "nextToken is not one the projection gave"),
    ({"filters": [{"name": "JOB_NAME", "values": ["a"]}] * 6}, "at most 5 filters"),
    ({"filters": [{"name": "JOB_NAME", "values": ["a"] * 101}]}, "at most 100 values"),
    ({"filters": [{"name": "JOB_NAME", "values": ["a" * 129]}]}, "at most 128 characters"),
    ({"filters": [{"name": "JOB_STATUS", "values": ["a"]}]}, "Unknown filter JOB_STATUS"),
])  # fmt: skip
def test_a_request_out_of_bounds_is_refused_before_any_job_is_read(workload, request_, words):
    _, con = workload
    request = {"jobQueue": "q", **request_}
    answer = queries.answer(con, "list-service-jobs", request)
    assert answer["error"]["type"] == "ClientException"
    assert words in answer["error"]["message"]
    with pytest.raises(ValueError) as refused:  # the projector: on its event loop
        projector_api.check_request("list-service-jobs", request)
    assert words in str(refused.value)


def test_the_last_page_has_no_token_and_a_token_past_the_end_gives_an_empty_page(workload):
    _, con = workload
    every = queries.list_service_jobs(con, {"jobQueue": "q", "jobStatus": "ALL",
                                            "maxResults": 1000})  # fmt: skip
    assert "nextToken" not in every
    oldest = queries.list_service_jobs(con, {"jobQueue": "q", "jobStatus": "ALL",
                                             "nextToken": _token({"submittedBefore": 0})})  # fmt: skip
    assert oldest == {"jobSummaryList": []}
