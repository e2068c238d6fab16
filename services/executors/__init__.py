"""Executors: follow the fact log, run what the scheduler dispatched, report back."""
