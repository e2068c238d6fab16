"""Microsoft ITP (ElasticFlow raw traces) -> traces/itp_2021_jobs.csv.

    python traces/convert/itp.py --source raw-traces.tar.gz [--out traces/itp_2021_jobs.csv]

The source is `data/raw-traces.tar.gz` of microsoft/elasticflow-traces (commit
277ed24d0e908c31a1c98145819e2e3853d8ac00, git blob 8147e243486d25a21abb12c1e50cbcf90aa72ebc:
`git hash-object raw-traces.tar.gz` prints it).  It holds cluster01.csv ... cluster10.csv with
`job_id,submission_time,duration,num_gpu`; team = the file's cluster name, the rest unchanged.
Rows with a non-positive duration or GPU count, a negative submit time or a field that is not
an integer are dropped and counted (the release has none).  Rerunning this on that archive
reproduces the vendored file byte for byte (tests/simulate/test_traces.py checks it when the
archive is given in QUOTASCHED_ITP_SOURCE).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ConvertError, Job, Tally, check_name, report, write_jobs  # noqa: E402

MEMBER = re.compile(r"^(?:.*/)?(cluster\d\d)\.csv$")
HEADER = ["job_id", "submission_time", "duration", "num_gpu"]


def read(source: str, tally: Tally) -> list[Job]:
    jobs: list[Job] = []
    with tarfile.open(source, "r:gz") as archive:
        members = sorted((m for m in archive.getmembers() if m.isfile() and MEMBER.match(m.name)),
                         key=lambda m: m.name)  # fmt: skip
        if not members:
            raise ConvertError(f"{source}: no clusterNN.csv inside")
        for member in members:
            team = MEMBER.match(member.name).group(1)
            handle = archive.extractfile(member)
            reader = csv.reader(io.TextIOWrapper(handle, encoding="utf-8", newline=""))
            header = next(reader, None)
            if header != HEADER:
                raise ConvertError(f"{member.name}:1: header {header}, expected {HEADER}")
            for line, row in enumerate(reader, start=2):
                if not row:
                    continue
                tally.read += 1
                where = f"{member.name}:{line}"
                try:
                    submit, duration, gpus = (int(v) for v in row[1:4])
                except ValueError:
                    tally.drop("a time or GPU count that is not an integer")
                    continue
                if gpus <= 0:
                    tally.drop("no GPUs")
                elif duration <= 0 or submit < 0:
                    tally.drop("non-positive duration or negative submit time")
                else:
                    jobs.append(Job(submit, team, check_name(row[0], "job_id", where), duration,
                                    gpus))  # fmt: skip
    return jobs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, help="raw-traces.tar.gz")
    parser.add_argument("--out", default=os.path.join("traces", "itp_2021_jobs.csv"))
    args = parser.parse_args(argv)
    tally = Tally()
    jobs = write_jobs(read(args.source, tally), args.out)
    report(tally, jobs, args.out)


if __name__ == "__main__":
    main()
