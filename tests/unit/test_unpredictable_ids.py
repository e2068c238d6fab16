"""Job ids a client does not choose can't be claimed ahead of it by another team (issue 29,
point 6): a derived id mixes in the submission itself, and one already taken is passed over.

Run through the real core, command by command, with every invariant checked (tests/builders).
"""

from __future__ import annotations

import uuid

from quotasched.events import facts as F
from quotasched.services.scheduler.core.jobs import JOB_ID_NAMESPACE
from tests.builders import G5, Cluster, of_kind, only

# Team 2's submission, as its Python client sends it without a jobId or clientToken.
TEAM_2 = {"jobName": "train", "jobQueue": "q", "quotaShareName": "qs2",
          "capacityUsage": [{"capacityUnit": G5, "quantity": 1}]}  # fmt: skip


def submit_team_2(cluster: Cluster, **fields) -> list[F.Fact]:
    return cluster.command("SubmitServiceJob", **{**TEAM_2, **fields})


def claim(cluster: Cluster, job_id: str, n: int) -> None:
    """Team 1 takes `job_id` as its own job's explicit jobId (a RESERVE share's queue)."""
    facts = cluster.command("SubmitServiceJob", jobId=job_id, jobName=f"claim-{n}", jobQueue="q",
                            quotaShareName="qs3", capacityUsage=[{"capacityUnit": G5,
                                                                  "quantity": 1}])  # fmt: skip
    assert of_kind(facts, F.JobSubmitted), facts


def test_pre_claiming_the_next_acceptance_numbers_refuses_no_other_teams_submission():
    cluster = Cluster.notebook()
    first = cluster.state.next_seq
    # What a rival could compute before issue 29: the ids of the next 40 acceptance numbers.
    # Its own 20 claims take 20 of them; team 2's submission gets one of the other 20.
    for n in range(20):
        claim(cluster, str(uuid.uuid5(JOB_ID_NAMESPACE, f"q/seq/{first + 20 + n}")), n)
    facts = submit_team_2(cluster)
    assert of_kind(facts, F.CommandRejected) == []
    job_id = only(facts, F.JobSubmitted).job_id
    assert cluster.job(job_id)["quotaShareName"] == "qs2"


def test_a_derived_id_depends_on_the_submission_not_only_on_its_acceptance_number():
    ids = []
    for name in ("train", "train-2"):
        cluster = Cluster.notebook()
        ids.append(only(submit_team_2(cluster, jobName=name), F.JobSubmitted).job_id)
    assert ids[0] != ids[1]


def test_the_same_commands_derive_the_same_ids_so_a_replay_agrees():
    def run() -> list[str]:
        cluster = Cluster.notebook()
        return [only(submit_team_2(cluster, jobName=f"j{n}"), F.JobSubmitted).job_id
                for n in range(3)]  # fmt: skip

    assert run() == run()


def test_an_id_a_rival_guessed_exactly_and_took_is_passed_over_not_refused():
    # Same history twice: a rival's submission, then team 2's.  In the first run the rival
    # takes an arbitrary id, which shows the id team 2's submission derives; in the second the
    # rival (knowing team 2's exact command) takes that very id first.
    honest = Cluster.notebook()
    claim(honest, "unrelated", 0)
    guessed = only(submit_team_2(honest), F.JobSubmitted).job_id

    cluster = Cluster.notebook()
    claim(cluster, guessed, 0)
    facts = submit_team_2(cluster)
    assert of_kind(facts, F.CommandRejected) == []
    job_id = only(facts, F.JobSubmitted).job_id
    assert job_id != guessed
    assert cluster.job(job_id)["quotaShareName"] == "qs2"
    assert cluster.job(guessed)["quotaShareName"] == "qs3"


def test_a_client_token_still_derives_its_documented_id_and_deduplicates():
    cluster = Cluster.notebook()
    job_id = only(submit_team_2(cluster, clientToken="tok-1"), F.JobSubmitted).job_id
    assert job_id == str(uuid.uuid5(JOB_ID_NAMESPACE, "q/token/tok-1"))
    again = only(submit_team_2(cluster, clientToken="tok-1"), F.SubmissionDeduplicated)
    assert again.job_id == job_id
