"""DuckDB projections of the fact log (per-queue, per-share and per-job utilization)."""
