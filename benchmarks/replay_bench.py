"""Replay throughput against the JSON serialization floor, and how it scales with queue size.

    .venv/bin/python benchmarks/replay_bench.py            # full run (several minutes)
    .venv/bin/python benchmarks/replay_bench.py --quick    # small sizes, about a minute
    .venv/bin/python benchmarks/replay_bench.py --profile  # also cProfile the main workload
    .venv/bin/python benchmarks/replay_bench.py --phases   # decode / decide / encode by kind

Workloads are generated (deterministically, by benchmarks/workload.py) into benchmarks/out/ and
reused on later runs.  Every measurement runs in its own child process (so peak RSS is per
workload and one workload's heap does not slow the next), and inside that process:

- floor:  `json.dumps(json.loads(line))` for every line: the cost of merely decoding and
          re-encoding the input with Python's json module;
- replay: `services.replay.replay_lines` over the same lines, encoding every fact exactly as
          `quotasched replay` does (`events.codec.encode_bytes`);

both over lines already read into memory, best of N repetitions, each replay from a fresh
State.  Times are the process's CPU time (`time.process_time`), which a busy shared machine
disturbs far less than wall-clock time; wall-clock figures are shown beside them.  For the
queue-level table the queue is first filled with cheap submissions (replayed, not timed) and
only the fixed window of mixed commands that follows is timed.

Targets (from the issue): replay <= 3x the floor on the 200k-command workload, and cost per
command flat as queues grow (largest / smallest <= 1.5 over the 50k..400k-command workloads).

The decision core runs compiled when `python -m quotasched.services.native build` has built it (`make
bench` does); the header says which, and the main workload is then measured once more with
the interpreted core (QUOTASCHED_PURE_PYTHON=1) for comparison.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):  # the project, and workload.py beside this file
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

OUT = ROOT / "benchmarks" / "out"
RATIO_TARGET = 3.0
FLAT_TARGET = 1.5


# -- child process: one measurement -------------------------------------------------------


def source_fingerprint() -> str:
    """Hash of the code a replay runs (events/, the core, services/replay.py).

    Other people may be changing the core while a long benchmark runs; parent and children
    compare fingerprints so a run that measured two versions says so."""
    import hashlib

    digest = hashlib.sha256()
    files = sorted([*(ROOT / "events").rglob("*.py"),
                    *(ROOT / "services" / "scheduler" / "core").rglob("*.py"),
                    ROOT / "services" / "replay.py"])  # fmt: skip
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _read_lines(path: Path) -> list[bytes]:
    with open(path, "rb") as handle:
        return handle.readlines()


def _clock() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def _floor(lines: list[bytes]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of decoding and re-encoding every line."""
    loads, dumps = json.loads, json.dumps
    cpu, wall = _clock()
    for line in lines:
        dumps(loads(line))
    cpu_end, wall_end = _clock()
    return cpu_end - cpu, wall_end - wall


def _replay(lines: list[bytes], start: int) -> tuple[float, float, int, int]:
    """CPU and wall seconds for lines[start:] (facts encoded as the CLI does), facts, bytes.

    lines[:start] are replayed first into the same state, untimed and unencoded."""
    from quotasched.events.codec import encode_bytes
    from quotasched.services.replay import replay_lines
    from quotasched.services.scheduler.core import State

    clock: list[tuple[float, float]] = []

    def feed():
        for index, line in enumerate(lines):
            if index == start:
                clock.append(_clock())
            yield line

    state = State()
    facts = size = 0
    for fact in replay_lines(feed(), state):
        if clock:
            size += len(encode_bytes(fact))
            facts += 1
    cpu_end, wall_end = _clock()
    return cpu_end - clock[0][0], wall_end - clock[0][1], facts, size


def measure(path: Path, window_size: int, reps: int) -> dict:
    """Time the last `window_size` lines (all of them when 0 or more than there are)."""
    import quotasched.services.replay  # noqa: F401  (import before fingerprinting what was imported)

    fingerprint = source_fingerprint()
    lines = _read_lines(path)
    start = max(0, len(lines) - window_size) if window_size else 0
    window = lines[start:]
    floors, replays, floor_walls, replay_walls = [], [], [], []
    facts = size = 0
    for _ in range(reps):
        gc.collect()
        cpu, wall = _floor(window)
        floors.append(cpu)
        floor_walls.append(wall)
        gc.collect()
        cpu, wall, facts, size = _replay(lines, start)
        replays.append(cpu)
        replay_walls.append(wall)
    return {
        "file": str(path), "commands": len(window), "prefill": start, "facts": facts,
        "factBytes": size, "floor": min(floors), "replay": min(replays),
        "floorWall": min(floor_walls), "replayWall": min(replay_walls),
        "floorRuns": floors, "replayRuns": replays,
        "peakRssMiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "fingerprint": fingerprint, "compiled": _compiled(),
    }  # fmt: skip


def _compiled() -> bool:
    from quotasched.services.scheduler.core import COMPILED

    return COMPILED


def profile(path: Path, top: int, dump: Path) -> None:
    import cProfile
    import pstats

    import quotasched.services.replay  # noqa: F401

    print(f"core source {source_fingerprint()}")
    lines = _read_lines(path)
    profiler = cProfile.Profile()
    profiler.enable()
    _replay(lines, 0)
    profiler.disable()
    profiler.dump_stats(str(dump))
    for order in ("cumulative", "tottime"):
        print(f"\n=== top {top} by {order} ({path.name}, {len(lines)} commands) ===")
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.strip_dirs().sort_stats(order).print_stats(top)


def phases(path: Path) -> dict:
    """Per command kind: how many, and the µs a command of it spends decoding, deciding (the
    core's `step`, facts assembled and folded) and encoding its facts, in one replay of
    `path` timed command by command (perf_counter around each phase: about 0.1 µs of the
    figures is the timing itself), with the `json` floor of the same lines beside them."""
    from collections import defaultdict

    from quotasched.events.codec import decode_command, encode_bytes
    from quotasched.services.scheduler.core import State, step

    lines = [line.rstrip(b"\r\n") for line in _read_lines(path)]
    clock, state = time.perf_counter, State()
    kinds: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0, []])
    for number, line in enumerate(lines, start=1):
        if number % 16384 == 0:
            gc.freeze()  # as services.replay does
        start = clock()
        command = decode_command(line)
        decoded = clock()
        facts = step(state, command, number, size=len(line))
        decided = clock()
        for fact in facts:
            encode_bytes(fact)
        encoded = clock()
        row = kinds[command.kind]
        row[0] += 1
        row[1] += decoded - start
        row[2] += decided - decoded
        row[3] += encoded - decided
        row[4] += len(facts)
        row[5].append(line)
    loads, dumps = json.loads, json.dumps
    out = {}
    for kind, (count, decode, decide, encode, facts, kind_lines) in kinds.items():
        start = clock()
        for line in kind_lines:
            dumps(loads(line))
        out[kind] = {"count": count, "decode": decode, "decide": decide, "encode": encode,
                     "facts": facts, "floor": clock() - start}  # fmt: skip
    return {"kinds": out, "compiled": _compiled()}


def print_phases(path: Path) -> None:
    """The phase table of `path` with each core this machine has (children, as measure)."""
    from quotasched.services.scheduler.core import COMPILED

    runs = {}
    for pure in (False, True) if COMPILED else (True,):
        env = {**os.environ, "QUOTASCHED_PURE_PYTHON": "1"} if pure else None
        result = subprocess.run([sys.executable, __file__, "--phases-only", str(path)],
                                check=True, capture_output=True, text=True, env=env)  # fmt: skip
        data = json.loads(result.stdout)
        runs["compiled" if data["compiled"] else "interpreted"] = data["kinds"]
    cores = list(runs)
    first = runs[cores[0]]
    total = sum(row["count"] for row in first.values())
    print(f"\nwhere a command's time goes, by kind ({path.name}; µs a command, wall clock "
          "timed phase by phase; decode and encode from the first core's run):")
    print(f"{'kind':26} {'share':>6} {'floor':>6} {'decode':>7} {'encode':>7} " +
          " ".join(f"{'decide ' + core:>20}" for core in cores))  # fmt: skip
    for kind, row in sorted(first.items(), key=lambda item: -item[1]["count"]):
        n = row["count"]
        if n * 200 < total:
            continue  # under half a percent of the commands
        decided = " ".join(f"{runs[core][kind]['decide'] / n * 1e6:20.2f}" for core in cores)
        print(f"{kind:26} {n / total:6.1%} {row['floor'] / n * 1e6:6.2f} "
              f"{row['decode'] / n * 1e6:7.2f} {row['encode'] / n * 1e6:7.2f} {decided}")  # fmt: skip
    floor = sum(row["floor"] for row in first.values()) / total * 1e6
    edges = sum(row["decode"] + row["encode"] for row in first.values()) / total * 1e6
    print(f"{'all commands':26} {'':>6} {floor:6.2f} decode + encode {edges:.2f} µs "
          f"({edges / floor:.2f}x the floor)")  # fmt: skip
    for core in cores:
        decide = sum(row["decide"] for row in runs[core].values()) / total * 1e6
        print(f"  deciding, {core} core: {decide:.2f} µs a command ({decide / floor:.2f}x the "
              f"floor); with decode and encode {(decide + edges) / floor:.2f}x")  # fmt: skip


# -- parent process: workloads, children, report ------------------------------------------


@dataclass
class Case:
    label: str
    path: Path
    commands: int  # timed commands
    queued: int
    prefill: int = 0


def ensure_workload(commands: int, queued: int, seed: int, prefill: int, fresh: bool) -> Path:
    name = (f"prefill{prefill}_window{commands}_s{seed}.jsonl" if prefill
            else f"mixed{commands}_q{queued}_s{seed}.jsonl")  # fmt: skip
    path = OUT / name
    if path.exists() and not fresh:
        return path
    # Generated in a child process too: the generator runs the core, and a big parent would
    # inflate every child's getrusage peak RSS (Linux carries the high-water mark over exec).
    started = time.perf_counter()
    temporary = path.with_suffix(".tmp")
    command = [sys.executable, str(ROOT / "benchmarks" / "workload.py"), "--commands",
               str(commands), "--queued", str(queued), "--prefill", str(prefill), "--seed",
               str(seed), "--out", str(temporary)]  # fmt: skip
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    os.replace(temporary, path)
    summary = re.sub(r" in [0-9.]+s;", ":", result.stderr.splitlines()[0])
    summary = summary.replace(str(temporary), path.name)
    print(f"  {summary} ({time.perf_counter() - started:.0f}s)", flush=True)
    return path


def run_child(case: Case, reps: int, pure: bool = False) -> dict:
    command = [sys.executable, __file__, "--measure", str(case.path), "--window",
               str(case.commands), "--reps", str(reps)]  # fmt: skip
    env = {**os.environ, "QUOTASCHED_PURE_PYTHON": "1"} if pure else None
    started = time.perf_counter()
    result = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    data = json.loads(result.stdout)
    data["wall"] = time.perf_counter() - started
    return data


def _us(seconds: float, commands: int) -> float:
    return seconds / commands * 1e6


def _row(case: Case, data: dict) -> list[str]:
    n = data["commands"]
    return [
        case.label, f"{n:,}", f"{case.queued:,}",
        f"{n / data['floor']:,.0f}", f"{_us(data['floor'], n):.1f}",
        f"{n / data['replay']:,.0f}", f"{_us(data['replay'], n):.1f}",
        f"{data['facts'] / data['replay']:,.0f}", f"{data['facts'] / n:.2f}",
        f"{data['replay'] / data['floor']:.1f}x",
        f"{_us(data['replayWall'], n):.1f} / {data['replayWall'] / data['floorWall']:.1f}x",
        f"{data['peakRssMiB']:,.0f}",
    ]  # fmt: skip


HEADERS = ["workload", "timed cmds", "queued", "floor cmd/s", "floor µs/cmd", "replay cmd/s",
           "replay µs/cmd", "facts/s", "facts/cmd", "replay/floor", "wall: replay µs/cmd / ratio",
           "peak RSS MiB"]  # fmt: skip


def _print_table(title: str, rows: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        print(f"\n{title}")
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
        print("  ".join(h.rjust(w) for h, w in zip(HEADERS, widths)))
        for row in rows:
            print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        return
    table = Table(title=title)
    for index, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=200).print(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, fast run")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, one repetition: that it runs (make test), no figures to quote")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (best of N)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="regenerate cached workloads")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile one replay of the main workload")
    parser.add_argument("--skip-levels", action="store_true", help="skip the queue-level table")
    parser.add_argument("--max-level", type=int, default=None,
                        help="largest queued-job level (default 1,000,000; quick 100,000)")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--window", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--phases", action="store_true",
                        help="also time decode, decide and encode by command kind, each core")
    parser.add_argument("--profile-only", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--phases-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.measure is not None:  # child
        print(json.dumps(measure(args.measure, args.window, args.reps or 3)))
        return
    if args.profile_only is not None:  # child
        profile(args.profile_only, 15, args.profile_only.with_suffix(".prof"))
        return
    if args.phases_only is not None:  # child
        print(json.dumps(phases(args.phases_only)))
        return

    if args.smoke:
        main_size, sizes, window = 2_000, [1_000, 2_000], 500
        levels = [1_000]
        reps = args.reps or 1
    elif args.quick:
        main_size, sizes, window = 20_000, [10_000, 20_000, 40_000], 5_000
        levels = [1_000, 10_000, 100_000]
        reps = args.reps or 2
    else:
        main_size, sizes, window = 200_000, [50_000, 100_000, 200_000, 400_000], 20_000
        levels = [10_000, 100_000, 1_000_000]
        reps = args.reps or 3
    if args.max_level is not None:
        levels = [level for level in levels if level <= args.max_level] or [args.max_level]
    started = time.perf_counter()
    fingerprint = source_fingerprint()
    from quotasched.services.scheduler.core import COMPILED, CORE_BUILD

    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    print(f"quotasched replay benchmark ({mode}, best of {reps}; "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; core source {fingerprint})",
          flush=True)  # fmt: skip
    print(f"decision core: {'compiled' if COMPILED else 'interpreted'} ({CORE_BUILD})", flush=True)
    load = os.getloadavg()
    print(f"times are process CPU time (wall-clock in the 'wall' column); load average at start "
          f"{load[0]:.1f}" + (" -- the machine is busy, expect noise" if load[0] > (os.cpu_count() or 1) * 0.5 else ""),
          flush=True)  # fmt: skip

    print("workloads:", flush=True)
    size_cases = [Case(f"mixed {n // 1000}k", ensure_workload(n, n // 2, args.seed, 0, args.fresh),
                       n, n // 2) for n in sizes]  # fmt: skip
    level_cases = []
    if not args.skip_levels:
        for level in levels:
            path = ensure_workload(window, level, args.seed, level, args.fresh)
            level_cases.append(Case(f"window @ {level // 1000}k queued", path, window, level,
                                    prefill=level))

    print("measuring:", flush=True)
    size_results = []
    for case in size_cases:
        data = run_child(case, reps)
        size_results.append(data)
        print(f"  {case.label}: replay {_us(data['replay'], data['commands']):.1f} µs/cmd, "
              f"floor {_us(data['floor'], data['commands']):.1f} µs/cmd ({data['wall']:.0f}s)",
              flush=True)  # fmt: skip
    level_results = []
    for case in level_cases:
        level_reps = reps if case.prefill < 500_000 else max(1, min(reps, 2))
        data = run_child(case, level_reps)
        level_results.append(data)
        print(f"  {case.label}: replay {_us(data['replay'], data['commands']):.1f} µs/cmd, "
              f"floor {_us(data['floor'], data['commands']):.1f} µs/cmd ({data['wall']:.0f}s)",
              flush=True)  # fmt: skip

    _print_table("Replay vs serialization floor: workloads of increasing size (queue ramps to "
                 "half the command count)", [_row(c, d) for c, d in zip(size_cases, size_results)])
    if level_cases:
        _print_table(f"Fixed window of {window:,} mixed commands after prefilling the queue "
                     "(prefill not timed)", [_row(c, d) for c, d in zip(level_cases, level_results)])

    main_index = sizes.index(main_size)
    main_data = size_results[main_index]
    ratio = main_data["replay"] / main_data["floor"]
    per_command = [d["replay"] / d["commands"] for d in size_results]
    flat = max(per_command) / min(per_command)
    print()
    print(f"main workload ({sizes[main_index]:,} commands, {sizes[main_index] // 2:,} queued at the end): "
          f"replay {main_data['commands'] / main_data['replay']:,.0f} cmd/s vs floor "
          f"{main_data['commands'] / main_data['floor']:,.0f} cmd/s")  # fmt: skip
    print(f"[target 1] replay/floor = {ratio:.2f}x (target <= {RATIO_TARGET:g}x): "
          f"{'PASS' if ratio <= RATIO_TARGET else 'MISS'}")
    if COMPILED:
        pure = run_child(size_cases[main_index], reps, pure=True)
        print(f"           the same workload with the interpreted core: "
              f"{pure['commands'] / pure['replay']:,.0f} cmd/s, replay/floor = "
              f"{pure['replay'] / pure['floor']:.2f}x; compiled is "
              f"{pure['replay'] / main_data['replay']:.2f}x as fast")  # fmt: skip
    print(f"[target 2] per-command cost, largest/smallest over {sizes[0]:,}..{sizes[-1]:,} "
          f"commands = {flat:.2f}x (target <= {FLAT_TARGET:g}x): "
          f"{'PASS' if flat <= FLAT_TARGET else 'MISS'}")  # fmt: skip
    if level_results:
        level_cost = [d["replay"] / d["commands"] for d in level_results]
        level_flat = max(level_cost) / min(level_cost)
        print(f"[target 2b] per-command cost of the window, largest/smallest over "
              f"{levels[0]:,}..{levels[-1]:,} queued jobs = {level_flat:.2f}x "
              f"(same {FLAT_TARGET:g}x bar): {'PASS' if level_flat <= FLAT_TARGET else 'MISS'}")
    if any(d["compiled"] != COMPILED for d in size_results + level_results):
        print("\nWARNING: some measurements ran the other decision core (a build appeared or "
              "went stale during the run): rerun for a consistent set")  # fmt: skip
    seen = {fingerprint, source_fingerprint()} | {d["fingerprint"] for d in size_results + level_results}
    if len(seen) > 1:
        print(f"\nWARNING: the core's source changed during the run ({', '.join(sorted(seen))}); "
              "the figures mix versions: rerun for a consistent set")  # fmt: skip
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.1f}; peak RSS of this (parent) process: "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB; "
          f"per workload in the tables; total {time.perf_counter() - started:.0f}s")

    if args.phases:
        print_phases(size_cases[main_index].path)
    if args.profile:
        path = size_cases[main_index].path
        print(f"\nprofiling one replay of {path.name} (cProfile; adds overhead)...", flush=True)
        subprocess.run([sys.executable, __file__, "--profile-only", str(path)], check=True)
        print(f"\nprofile saved to {path.with_suffix('.prof')}")


if __name__ == "__main__":
    main()
