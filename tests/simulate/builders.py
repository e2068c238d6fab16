"""Small builders for hand-made simulations: a configuration and a trace from literal rows."""

from __future__ import annotations

from quotasched.services.simulate import SimConfig, Trace, parse_config


def config(shares: list[dict], pool: int, **extra) -> SimConfig:
    """A configuration of `shares` on a pool of `pool` one-GPU instances (`extra`: any other
    top-level field, e.g. raise_to_largest_job)."""
    return parse_config({"name": extra.pop("name", "t"), "environment": {"max_instances": pool},
                         "shares": shares, **extra})  # fmt: skip


def trace(*rows: tuple) -> Trace:
    """Rows of (job_id, submit_time_s, duration_s, gpus, team[, job_type]) in submit order."""
    out = Trace()
    for row in rows:
        out.append(*row)
    return out
