"""Shanghai AI Lab Acme (AcmeTrace) -> traces/acme_<cluster>_jobs.csv, one cluster's GPU jobs.

    python traces/convert/acme.py --source trace_kalos.csv [--cluster kalos] [--out PATH]

The source is `data/job_trace/trace_kalos.csv` (or `trace_seren.csv`) of InternLM/AcmeTrace at
commit 6d6ac9cd15f3b01151ac6ba00ecddd9156f0dc73 (git blobs: kalos
6e6c11a6308e403a2b75f3dec2d9cf48263c1a52, seren 3133535311d36ecc404d4446e129036a1057c6f2;
`git hash-object FILE` must print the one of the file).  Columns (README of the source):
`job_id,user,node_num,gpu_num,cpu_num,[mem_per_pod_GB,shared_mem_per_pod,]type,state,
submit_time,start_time,end_time,[fail_time,stop_time,]duration,queue,gpu_time`, times ISO 8601
with an offset ("2023-05-17 11:00:58+00:00").

Transformation (traces/README.md repeats it):
- team = `user` (hashed user id): the source has no virtual cluster or group, so each user is a
  tenant; a quota config maps users to at most 20 shares (`teams:` lists, `default_share`);
- job_type = `type` (the LLM-development workload class: Pretrain, SFT, Evaluation, Debug, MLLM,
  Other, ...), with any character other than letters, digits, '-' and '_' replaced by '_';
- `gpus = gpu_num`; a job with gpu_num 0 (CPU job) is dropped and counted, and so is a
  fractional one (none expected);
- `duration_s = duration` (end - start, seconds); a zero or missing duration (never started)
  is dropped and counted;
- `submit_time_s` = seconds from 00:00:00 (in the first timestamp's offset) of the day of the
  first kept submission;
- every final state is kept (the GPUs were held either way); a row whose numbers or submit time
  do not parse, whose job_id or user is not a quotasched name (1-128 letters, digits, '-',
  '_'), or whose job_id was already seen, is dropped and counted.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import sys
from collections import Counter
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import NAME, ConvertError, Job, Tally, report, write_jobs  # noqa: E402

REQUIRED = ("job_id", "user", "gpu_num", "type", "state", "submit_time", "duration")
NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")


def _integer(text: str) -> int:
    value = float(text)
    if value != value or value != int(value):
        raise ValueError(text)
    return int(value)


def read(source: str, tally: Tally) -> tuple[list[Job], datetime, Counter]:
    kept: list[tuple[datetime, str, str, int, int, str, str]] = []
    seen: set[str] = set()
    with open(source, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ConvertError(f"{source}:1: header lacks {', '.join(missing)}")
        for row in reader:
            tally.read += 1
            try:
                gpus = _integer(row["gpu_num"])
            except (TypeError, ValueError):
                tally.drop("a GPU count that is missing or not a whole number")
                continue
            if gpus <= 0:
                tally.drop("no GPUs (CPU job)")
                continue
            try:
                duration = _integer(row["duration"]) if row["duration"] else 0
                submit = datetime.fromisoformat(row["submit_time"])
            except (TypeError, ValueError):
                tally.drop("a submit time or duration that does not parse")
                continue
            if submit.tzinfo is None:
                tally.drop("a submit time that does not parse")
            elif duration <= 0:
                tally.drop("zero or missing duration (never ran)")
            elif not (NAME.match(row["job_id"]) and NAME.match(row["user"] or "")):
                tally.drop("a job_id or user that is not 1-128 letters, digits, '-' or '_'")
            elif row["job_id"] in seen:
                tally.drop("job_id seen before")
            else:
                seen.add(row["job_id"])
                kept.append((submit, row["job_id"], row["user"], duration, gpus,
                             NOT_NAME.sub("_", row["type"] or ""), row["state"]))
    if not kept:
        raise ConvertError(f"{source}: no GPU job kept")
    origin = min(k[0] for k in kept).replace(hour=0, minute=0, second=0, microsecond=0)
    jobs = [Job(int((submit - origin).total_seconds()), user, job_id, duration, gpus, kind)
            for submit, job_id, user, duration, gpus, kind, _ in kept]  # fmt: skip
    return jobs, origin, Counter(k[6] for k in kept)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, help="trace_kalos.csv or trace_seren.csv")
    parser.add_argument("--cluster", choices=("kalos", "seren"),
                        help="names the default output; default: from the file name")
    parser.add_argument("--out", help="default: traces/acme_<cluster>_jobs.csv")
    args = parser.parse_args(argv)
    cluster = args.cluster or ("seren" if "seren" in os.path.basename(args.source) else "kalos")
    out = args.out or os.path.join("traces", f"acme_{cluster}_jobs.csv")
    tally = Tally()
    jobs, origin, states = read(args.source, tally)
    jobs = write_jobs(jobs, out)
    report(tally, jobs, out)
    print(f"  origin (submit_time_s 0): {origin.isoformat()}")
    print("  final states kept: " + ", ".join(f"{s} {n:,}" for s, n in states.most_common()))


if __name__ == "__main__":
    main()
