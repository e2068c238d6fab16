"""ListServiceJobs' bounds and paging (issue 29 point 1): AWS's maxResults range, bounded
filters, pages that each fit the bus and together hold every job once, and the same matches
as before the read index (a simple model of AWS's JOB_NAME rule, newest first)."""

from __future__ import annotations

import json
import random

import pytest

from quotasched.services.scheduler.api import answer
from quotasched.services.scheduler.reads import ReadIndex, Selection
from tests.builders import Cluster

STATUSES = ("RUNNABLE", "SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED")


def cluster() -> Cluster:
    c = Cluster(check_purity=False, independent=False)
    c.environment(g5=4)
    c.queue()
    c.share("qs1", "LEND_AND_BORROW", borrow=200, in_share=True, g5=2)
    c.share("qs2", "RESERVE", g5=2)
    return c


def submit(c: Cluster, job_id: str, share: str, job_name: str, **extra) -> None:
    c.command("SubmitServiceJob", jobId=job_id, jobName=job_name, jobQueue="q",
              quotaShareName=share, capacityUsage=[{"capacityUnit": "ml.g5.xlarge",
                                                    "quantity": 1}], **extra)  # fmt: skip


def listed(state, read_index=None, max_bytes=1024 * 1024, **request) -> list[dict]:
    """Every page of a listing, following nextToken."""
    pages, token = [], None
    while True:
        asked = {"jobQueue": "q", **request, **({"nextToken": token} if token else {})}
        page = answer(state, "list-service-jobs", asked, read_index, max_bytes)
        assert "error" not in page, page
        pages.append(page)
        token = page.get("nextToken")
        if token is None:
            return pages


def refusal(state, **request) -> str:
    got = answer(state, "list-service-jobs", {"jobQueue": "q", **request})
    assert "error" in got, got
    return got["error"]["message"]


@pytest.mark.parametrize("max_results", [0, 1001, -1, "5"])
def test_max_results_outside_one_to_a_thousand_is_refused(max_results):
    c = cluster()
    c.submit("a", "qs1")
    assert "maxResults" in refusal(c.state, maxResults=max_results)


def test_a_filter_with_too_many_values_is_refused():
    c = cluster()
    values = [f"name-{i}" for i in range(101)]
    assert "at most 100 values" in refusal(c.state, filters=[{"name": "JOB_NAME",
                                                               "values": values}])
    assert "jobSummaryList" in answer(c.state, "list-service-jobs", {
        "jobQueue": "q", "filters": [{"name": "JOB_NAME", "values": values[:100]}]})


def test_a_filter_value_longer_than_a_job_name_is_refused():
    c = cluster()
    assert "at most 128 characters" in refusal(
        c.state, filters=[{"name": "JOB_NAME", "values": ["x" * 129]}])


def test_too_many_filters_are_refused():
    c = cluster()
    assert "at most 5 filters" in refusal(
        c.state, filters=[{"name": "JOB_NAME", "values": ["a"]}] * 6)


def test_a_next_token_this_api_never_gave_is_refused():
    c = cluster()
    assert "nextToken" in refusal(c.state, jobStatus="ALL", nextToken="not-a-token")


def test_pages_hold_every_job_exactly_once_and_each_fits_the_bus():
    c = cluster()
    for i in range(120):  # long names and tags: big summaries, so the byte bound cuts pages
        submit(c, f"j{i:03d}", "qs1" if i % 2 else "qs2", f"{'n' * 120}{i:03d}",
               tags={f"k{k}": "t" * 256 for k in range(8)})
    max_bytes = 16 * 1024
    pages = listed(c.state, max_bytes=max_bytes, jobStatus="ALL", maxResults=1000)
    ids = [job["jobId"] for page in pages for job in page["jobSummaryList"]]
    assert sorted(ids) == sorted(c.state.jobs) and len(ids) == len(set(ids))
    assert ids == sorted(ids, reverse=True)  # newest first across the pages
    assert len(pages) > 2  # cut by bytes: 1000 results would not fit 16 KiB
    assert all(len(json.dumps(page).encode()) <= max_bytes for page in pages)


def test_max_results_pages_hold_every_job_exactly_once():
    c = cluster()
    for i in range(25):
        c.submit(f"j{i:02d}", "qs1")
    pages = listed(c.state, jobStatus="ALL", maxResults=4)
    assert [len(page["jobSummaryList"]) for page in pages] == [4] * 6 + [1]  # none empty
    ids = [job["jobId"] for page in pages for job in page["jobSummaryList"]]
    assert ids == sorted(c.state.jobs, reverse=True)


def model(state, status=None, shares=(), patterns=(), after=None) -> list[str]:
    """AWS's rule, over every job: newest first; JOB_NAME matches case-insensitively, a
    trailing `*` is a prefix; with JOB_NAME the status is ignored."""
    def named(name: str, pattern: str) -> bool:
        name, pattern = name.lower(), pattern.lower()
        return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern

    kept = []
    for job in sorted(state.jobs.values(), key=lambda job: -job.seq):
        if patterns and not any(named(job.job_name, p) for p in patterns):
            continue
        if not patterns and status != "ALL" and job.status.value != (status or "RUNNING"):
            continue
        if shares and job.share not in shares:
            continue
        if after is not None and job.created_at * 1000 <= after:
            continue
        kept.append(job.job_id)
    return kept


def test_job_name_status_and_share_matches_are_those_of_the_simple_model():
    rng = random.Random(29)
    c = cluster()
    stems = ["Train", "train-a", "TRAIN-b", "eval", "evaluate", "x", "tr"]
    index = ReadIndex(c.state)
    for round_ in range(4):  # jobs added between reads: the index catches up incrementally
        for i in range(40):
            job_id = f"r{round_}-{i:02d}"
            c.at += 1.0
            submit(c, job_id, rng.choice(["qs1", "qs2"]),
                   f"{rng.choice(stems)}{rng.choice(['', '1', '10', '-x'])}")
            if rng.random() < 0.3 and c.status(job_id) == "SCHEDULED":
                c.finish(job_id)
        patterns_tried = [["train"], ["TRAIN*"], ["train-*", "eval"], ["*"], ["Tr*", "x"],
                          ["nobody"], ["evaluate*"], ["train1", "TRAIN10"]]
        for patterns in patterns_tried:
            for shares in ([], ["qs1"]):
                filters = [{"name": "JOB_NAME", "values": patterns}]
                if shares:
                    filters.append({"name": "QUOTA_SHARE_NAME", "values": shares})
                got = [job["jobId"] for page in listed(c.state, index, filters=filters,
                                                        maxResults=7)
                       for job in page["jobSummaryList"]]  # fmt: skip
                assert got == model(c.state, patterns=patterns, shares=shares), patterns
        for status in (None, "ALL", *STATUSES):
            for shares in ([], ["qs2"]):
                filters = [{"name": "QUOTA_SHARE_NAME", "values": shares}] if shares else []
                request = {"filters": filters, **({"jobStatus": status} if status else {})}
                got = [job["jobId"] for page in listed(c.state, index, maxResults=5, **request)
                       for job in page["jobSummaryList"]]  # fmt: skip
                assert got == model(c.state, status=status, shares=shares), (status, shares)
        after = int((c.at - 20) * 1000)
        pages = listed(c.state, index, jobStatus="ALL", filters=[
            {"name": "AFTER_CREATED_AT", "values": [str(after)]}])
        got = [job["jobId"] for page in pages for job in page["jobSummaryList"]]
        assert got == model(c.state, status="ALL", after=after)


def test_a_request_examines_at_most_its_budget_and_the_rest_follows_on_later_pages():
    c = cluster()
    for i in range(60):
        submit(c, f"j{i:02d}", "qs1", "rare" if i % 20 == 0 else "common")
    index = ReadIndex(c.state)
    index.catch_up()
    found, cursor, pages = [], None, 0
    while True:
        walk = index.scan("q", cursor)
        examined = []
        selection = Selection((examined.append(job) or job for job in walk),
                              lambda job: job.job_name == "rare", limit=10, budget=7)
        for _ in selection.steps():
            pass
        page, cursor = selection.kept, selection.next_seq
        assert len(examined) <= 10 + 7
        found += [job.job_id for job in page]
        pages += 1
        if cursor is None:
            break
    assert found == ["j40", "j20", "j00"] and pages > 3  # short pages, nothing lost


def test_a_deferred_page_encodes_to_the_bytes_of_its_document():
    c = cluster()
    for i in range(250):  # more than one encoding chunk
        submit(c, f"j{i:03d}", "qs1", f"name-{i}")
    deferred = answer(c.state, "list-service-jobs", {"jobQueue": "q", "jobStatus": "ALL",
                                                     "maxResults": 240}, None, 1024 * 1024, True)
    page = deferred["jobSummaryList"]
    steps = sum(1 for _ in page.steps())
    # the selection pauses every Selection.STEP jobs examined (241: the page and one more to
    # know there is a next page), then the encoding every CHUNK summaries
    assert steps == 241 // Selection.STEP + 240 // page.CHUNK - 1
    assert "nextToken" in page.document()
    assert page.encode() == json.dumps(page.document()).encode()
    assert page.document() == answer(c.state, "list-service-jobs", {
        "jobQueue": "q", "jobStatus": "ALL", "maxResults": 240})
