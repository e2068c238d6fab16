"""SenseTime Helios (HeliosData) -> traces/helios_<cluster>_jobs.csv, one cluster's GPU jobs.

    python traces/convert/helios.py --source data.zip [--cluster Venus] [--out PATH]
    python traces/convert/helios.py --source Venus/cluster_log.csv --cluster Venus

The source is `data.zip` of S-Lab-System-Group/HeliosData at commit
159f0caeec16600b9b6017862952a36aae01c43f (git blob 1a48d5e0fb816fe9bbf1ad7086e7dec90923e5c6:
`git hash-object data.zip` must print it), or one `<cluster>/cluster_log.csv` extracted from it.
Each cluster's log has `job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,
end_time,duration,queue`, times as "YYYY-MM-DD HH:MM:SS" wall clock, no offset.

Transformation (traces/README.md repeats it):
- one cluster's log (default Venus, the one with the fewest GPU jobs); team = `vc`, the virtual
  cluster the job ran in; job_type empty (the log has no job class); job_id unchanged;
- `gpus = gpu_num`; jobs with gpu_num 0 (CPU jobs) are dropped and counted;
- `duration_s = duration` (end - start, seconds, queueing excluded); a zero duration is dropped
  and counted (the reader needs > 0; such a job held its GPUs for no time, so GPU time is kept);
- `submit_time_s` = seconds from 00:00:00 of the day of the first kept submission;
- every final state is kept (COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL): the GPUs were
  held either way, as for ITP;
- a row whose submit time or numbers do not parse, whose job_id or vc is not a quotasched name
  (1-128 letters, digits, '-', '_'), or whose job_id was already seen, is dropped and counted;
- `--since/--until` (dates, inclusive/exclusive) keep a window if wanted (default: all).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import sys
import zipfile
from collections import Counter
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import NAME, ConvertError, Job, Tally, report, write_jobs  # noqa: E402

CLUSTERS = ("Earth", "Saturn", "Uranus", "Venus")
REQUIRED = ("job_id", "vc", "gpu_num", "state", "submit_time", "duration")
TIME = "%Y-%m-%d %H:%M:%S"


def open_log(source: str, cluster: str):
    """A text stream over the cluster's cluster_log.csv, from data.zip or a plain CSV."""
    if zipfile.is_zipfile(source):
        archive = zipfile.ZipFile(source)
        pattern = re.compile(rf"(?:^|/){cluster}/cluster_log\.csv$")
        names = [n for n in archive.namelist() if pattern.search(n)]
        if len(names) != 1:
            raise ConvertError(f"{source}: expected one {cluster}/cluster_log.csv, found {names}")
        return names[0], io.TextIOWrapper(archive.open(names[0]), encoding="utf-8-sig", newline="")
    return source, open(source, newline="", encoding="utf-8-sig")


def _integer(text: str) -> int:
    value = float(text)
    if value != int(value):
        raise ValueError(text)
    return int(value)


def read(source: str, cluster: str, tally: Tally, since: str | None = None,
         until: str | None = None) -> tuple[list[Job], datetime, Counter]:  # fmt: skip
    """The kept jobs (submit_s filled in), the origin, and the kept jobs' final states."""
    lo = datetime.strptime(since, "%Y-%m-%d") if since else None
    hi = datetime.strptime(until, "%Y-%m-%d") if until else None
    name, handle = open_log(source, cluster)
    kept: list[tuple[datetime, str, str, int, int, str]] = []
    seen: set[str] = set()
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ConvertError(f"{name}:1: header lacks {', '.join(missing)}")
        for row in reader:
            tally.read += 1
            try:
                gpus = _integer(row["gpu_num"])
                duration = _integer(row["duration"])
                submit = datetime.strptime(row["submit_time"], TIME)
            except (TypeError, ValueError):
                tally.drop("a submit time, duration or GPU count that does not parse")
                continue
            if gpus <= 0:
                tally.drop("no GPUs (CPU job)")
            elif duration <= 0:
                tally.drop("zero duration")
            elif (lo and submit < lo) or (hi and submit >= hi):
                tally.drop("outside --since/--until")
            elif not (NAME.match(row["job_id"]) and NAME.match(row["vc"] or "")):
                tally.drop("a job_id or vc that is not 1-128 letters, digits, '-' or '_'")
            elif row["job_id"] in seen:
                tally.drop("job_id seen before")
            else:
                seen.add(row["job_id"])
                kept.append((submit, row["job_id"], row["vc"], duration, gpus, row["state"]))
    if not kept:
        raise ConvertError(f"{name}: no GPU job kept")
    origin = min(k[0] for k in kept).replace(hour=0, minute=0, second=0)
    jobs = [Job(int((submit - origin).total_seconds()), vc, job_id, duration, gpus)
            for submit, job_id, vc, duration, gpus, _ in kept]  # fmt: skip
    return jobs, origin, Counter(k[5] for k in kept)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, help="data.zip, or one cluster_log.csv")
    parser.add_argument("--cluster", default="Venus", choices=CLUSTERS)
    parser.add_argument("--since", help="first submit date kept, YYYY-MM-DD (default: all)")
    parser.add_argument("--until", help="submit dates before this one kept (default: all)")
    parser.add_argument("--out", help="default: traces/helios_<cluster>_jobs.csv")
    args = parser.parse_args(argv)
    out = args.out or os.path.join("traces", f"helios_{args.cluster.lower()}_jobs.csv")
    tally = Tally()
    jobs, origin, states = read(args.source, args.cluster, tally, args.since, args.until)
    jobs = write_jobs(jobs, out)
    report(tally, jobs, out)
    print(f"  origin (submit_time_s 0): {origin:%Y-%m-%d %H:%M:%S} (log wall clock)")
    print("  final states kept: " + ", ".join(f"{s} {n:,}" for s, n in states.most_common()))


if __name__ == "__main__":
    main()
