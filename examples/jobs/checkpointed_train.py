"""A training job that survives preemption: it saves its progress and resumes from it.

Plain Python, no ML library: each "step" sleeps a little.  It shows the three things a real
training script does under quotasched's GPU agent (or on SageMaker):

1. On start, load the latest checkpoint from its checkpoint directory, if there is one:
   `$QUOTASCHED_CHECKPOINT_DIR` (the agent gives every attempt of a job the same directory),
   else SageMaker's `/opt/ml/checkpoints` (a container with a CheckpointConfig, or SageMaker
   itself, which syncs it with CheckpointConfig.S3Uri), else `./checkpoints` (run by hand).
2. Save every `--every` steps, atomically: a temporary file, fsync, then a rename, so a kill
   at any moment leaves the previous checkpoint or the new one, never half of one.
3. On SIGTERM (a preemption or a termination), finish the current step, save, and exit
   before the grace period is over (the agent's --grace, or the job's tag `grace`, at most
   QUOTASCHED_PREEMPT_GRACE_MAX_S); SIGKILL follows it.

    python checkpointed_train.py --steps 40 --every 5 --step-seconds 0.1

It prints where its checkpoints are, `resumed from step K` when it found one, `SIGTERM: saved
step K` when stopped, and `done at step N` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

STATE = "state.json"


def checkpoint_dir() -> str:
    """quotasched's directory for the job, else SageMaker's, else ./checkpoints (by hand)."""
    if os.environ.get("QUOTASCHED_CHECKPOINT_DIR"):
        return os.environ["QUOTASCHED_CHECKPOINT_DIR"]
    return "/opt/ml/checkpoints" if os.path.isdir("/opt/ml/checkpoints") else "checkpoints"


def load(directory: str) -> int:
    """The step of the latest checkpoint, 0 without one."""
    try:
        with open(os.path.join(directory, STATE), encoding="utf-8") as handle:
            return int(json.load(handle)["step"])
    except FileNotFoundError:
        return 0


def save(directory: str, step: int) -> None:
    """Write the checkpoint so that it is whole or absent, never torn."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, STATE)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump({"step": step, "saved_at": time.time()}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    folder = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself, durable
    finally:
        os.close(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps in the whole training")
    parser.add_argument("--every", type=int, default=5, help="save every this many steps")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="how long a step takes")
    parser.add_argument("--save-seconds", type=float, default=0.0,
                        help="how long a save on SIGTERM takes (a large model's)")
    args = parser.parse_args(argv)

    stopping = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))

    directory = checkpoint_dir()
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "none")
    print(f"on GPU {gpus}, attempt {os.environ.get('QUOTASCHED_ATTEMPT', '?')}", flush=True)
    print(f"checkpoints in {directory}", flush=True)
    step = load(directory)
    print(f"resumed from step {step}" if step else "starting from step 0", flush=True)
    while step < args.steps:
        time.sleep(args.step_seconds)  # one step of training
        step += 1
        if stopping:
            time.sleep(args.save_seconds)
            save(directory, step)
            print(f"SIGTERM: saved step {step}, exiting", flush=True)
            return 128 + signal.SIGTERM
        if step % args.every == 0 and step < args.steps:
            save(directory, step)
            print(f"saved step {step}", flush=True)
    save(directory, step)  # the trained model, in a real script (to /opt/ml/model on SageMaker)
    print(f"done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
