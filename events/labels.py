"""How a person reads a job: its name first.

Jobs submitted with the AWS CLI, boto3 or the SageMaker SDK have UUID ids; a line that reads
"db521753-... preempted by 6eade2ec-..." tells an operator nothing.  Every human-facing output
(explain, the web view, the report, the scheduler's story lines) names a job with
`job_label`: its name, then the first characters of its id in brackets, which tell apart jobs
that share a name and are enough to find the job again (`quotasched explain`, the web view's
search and `describe-service-job` take an id, and explain and the web view a name too).  A
job whose id is its name (as the demo's are) is just that name.

Machine-facing outputs (facts, the AWS API, SQL) keep ids whole.
"""

from __future__ import annotations

SHORT_ID = 8  # a UUID's first group: 4 billion values, unique among any queue's jobs in practice


def job_label(job_id: str, job_name: str = "") -> str:
    """`name (id prefix)`, or the id alone when there is no other name to show."""
    if not job_name or job_name == job_id:
        return job_id
    short = job_id if len(job_id) <= SHORT_ID + 2 else job_id[:SHORT_ID]
    return f"{job_name} ({short})"
