"""What a run's set-up decided that the configuration does not say: the warnings of a run.

- `lifted_quotas`: the quotas `raise_to_largest_job` lifted to a share's largest job (a
  limit below it would block the share's head for good under RESERVE or LEND), and by how
  much the lifted quotas together exceed the pool (oversubscription: the limits then promise
  more than the pool holds);
- `absent_teams`: teams a share names that submit nothing in the trace; a share left with no
  job at all holds its quota idle for the whole run (RESERVE), or only lends it.

Both return values; the shell words and prints them (standard error), nothing here logs.
"""

from __future__ import annotations

from dataclasses import dataclass

from quotasched.services.simulate.engine import Run


@dataclass(frozen=True)
class Lift:
    share: str
    teams: list[str]
    configured: int  # instances, from limit or weight
    lifted: int  # instances, the largest job's need
    largest_job: int  # instances


@dataclass(frozen=True)
class LiftedQuotas:
    config: str
    lifts: list[Lift]
    pool: int  # instances
    lifted_total: int  # every share's limit as the run used it, together

    @property
    def oversubscribed_by(self) -> int:
        """Instances the lifted quotas together promise beyond the pool (0: they fit)."""
        return max(0, self.lifted_total - self.pool)


@dataclass(frozen=True)
class AbsentTeam:
    config: str
    team: str
    share: str
    strategy: str
    limit: int  # instances
    share_idle: bool  # no team of the share submits anything: its whole quota is unused
    borrowers: bool  # another share with jobs borrows (LEND_AND_BORROW): lending finds a use


def lifted_quotas(run: Run) -> LiftedQuotas | None:
    """The lifts of `raise_to_largest_job` in this run; None when it lifted nothing."""
    configured = run.config.configured_limits()
    lifts = [
        Lift(share.name, list(share.teams), configured[share.name], run.limits[share.name],
             run.largest_job[share.name])
        for share in run.config.shares if run.limits[share.name] > configured[share.name]
    ]  # fmt: skip
    if not lifts:
        return None
    return LiftedQuotas(run.config.name, lifts, run.config.environment.max_instances,
                        sum(run.limits.values()))  # fmt: skip


def absent_teams(run: Run) -> list[AbsentTeam]:
    """Teams the configuration names that have no job in the trace, in configuration order."""
    present = set(run.trace.team)
    used = set(run.share_of_job)
    out = []
    for share in run.config.shares:
        borrowers = any(other.strategy.value == "LEND_AND_BORROW" and other.name in used
                        for other in run.config.shares if other.name != share.name)  # fmt: skip
        for team in share.teams:
            if team not in present:
                out.append(AbsentTeam(run.config.name, team, share.name, share.strategy.value,
                                      run.limits[share.name], share.name not in used,
                                      borrowers))  # fmt: skip
    return out
