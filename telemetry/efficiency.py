"""Job efficiency (DESIGN.md §9.4): what training loops reported, per workload, model, pool or
team over a period, from the job sums ingest adds to ``JobHour``.

Figures of one group (sums over its JobHour rows):

- ``gpu_hours`` = Σ wall_s / 3600: the GPU seconds the reports cover (each GPU of a job carries
  the job's wall time, so a job on 2 GPUs for an hour is 2 GPU hours);
- ``mfu`` = Σ flops / Σ (peak flops/s of the GPU × flops_wall_s), over the rows whose GPU model
  has a known peak (:func:`peak_flops`) and whose job gave flops; ``None`` where none has;
- ``data_starved_share`` = Σ data_wait_s / Σ wall_s; ``checkpoint_share`` = Σ ckpt_s / Σ wall_s;
- ``tokens_per_gpu_hour`` = Σ tokens / gpu_hours.

No money here (telemetry knows none): each row carries its ``parts`` (per GPU and site: the
GPU seconds the reports cover, the hours they span and the energy those seconds drew), which
billing prices for the cost per million tokens (``billing.efficiency``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from config.replica import read_cursor
from fleet.catalogue import catalogue_match

GROUP_BY = ("workload", "model", "pool", "team")
UNASSIGNED = "(none)"

# Dense bf16 peaks per second by catalogue key (fleet/catalogue.py), as torchtitan and nanochat
# use them (docs/shared NOTES): what MFU divides by. H200 NVL is not in DESIGN §9.4's list; its
# published dense bf16 peak is 836 TF.
PEAK_FLOPS: dict[str, float] = {
    "H100-SXM": 989e12,
    "H100-PCIE": 756e12,
    "H100-NVL": 835e12,
    "H200-SXM": 989e12,
    "H200-NVL": 836e12,
    "A100-SXM": 312e12,
    "A100-PCIE": 312e12,
    "A100-PCIE-40GB": 312e12,
    "L40S": 362e12,
}


def fleet_peaks() -> dict[str, float]:
    """The fleet file's ``[[peaks]]`` (``FleetSettings.peaks``, TFLOP/s) in flops per second,
    as :func:`peak_flops` takes them."""
    from fleet.models import FleetSettings

    return {key: float(tflops) * 1e12 for key, tflops in FleetSettings.load().peaks.items()}


def peak_flops(gpu_name: str, overrides: Mapping[str, float] | None = None) -> float | None:
    """The dense bf16 peak (flops per second) of a GPU by its NVML name (``NVIDIA H100 80GB
    HBM3`` is an H100 SXM), or ``None`` where unknown. ``overrides`` (the fleet file's
    ``[[peaks]]``): flops per second by catalogue key (``H100-SXM``) or by the exact NVML name;
    the name wins over the key, both over the table."""
    if overrides:
        if gpu_name in overrides:
            return float(overrides[gpu_name])
    entry = catalogue_match(gpu_name) if gpu_name else None
    if entry is None:
        return None
    if overrides and entry.key in overrides:
        return float(overrides[entry.key])
    return PEAK_FLOPS.get(entry.key)


@dataclass
class JobPart:
    """The GPU seconds of a group's reports on one GPU at one site: what billing prices.
    ``energy_j``: the energy those seconds drew, i.e. the workload's energy on that GPU in each
    hour (its hourly rollup) × min(1, wall_s / its GPU seconds), or, for reports of no
    workload, the GPU's energy in that hour × min(1, wall_s / observed seconds); 0 in an hour
    not rolled up yet. ``first_hour`` .. ``last_hour``: the UTC hours the reports fall in."""

    gpu_id: int
    site_id: int | None
    first_hour: dt.datetime
    last_hour: dt.datetime
    wall_s: float
    energy_j: float


@dataclass
class EfficiencyRow:
    key: str
    kind: str | None  # workloads only
    workload_id: int | None  # workloads only
    gpu_hours: float
    steps: float
    samples: float
    tokens: float
    mfu: float | None
    data_starved_share: float | None
    checkpoint_share: float | None
    tokens_per_gpu_hour: float | None
    parts: list[JobPart] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "kind": self.kind,
            "gpu_hours": self.gpu_hours,
            "steps": self.steps,
            "samples": self.samples,
            "tokens": self.tokens,
            "mfu": self.mfu,
            "data_starved_share": self.data_starved_share,
            "checkpoint_share": self.checkpoint_share,
            "tokens_per_gpu_hour": self.tokens_per_gpu_hour,
        }


# One row per (workload, model, GPU, pool, team, site) of the period, summed in the database.
# Pool, team and site: the GPU's attribution in that hour as the rollup recorded it
# (HourlyUsage), else where the GPU belongs now (an hour not rolled up yet). The energy of the
# reported seconds (JobPart): a share of the workload's rolled-up energy on that GPU in that
# hour, else of the GPU's, never more than all of it (CASE: portable to SQLite, no LEAST).
_SUMS_SQL = """
SELECT j.workload_id, w.kind, w.key, w.user_name, w.account, j.model, g.name,
       COALESCE(h.pool_id, n.pool_id), COALESCE(h.team_id, g.team_id, p.team_id),
       j.gpu_id, COALESCE(wh.site_id, h.site_id, n.site_id, p.site_id),
       sum(j.steps), sum(j.samples), sum(j.tokens), sum(j.flops), sum(j.wall_s),
       sum(j.data_wait_s), sum(j.ckpt_s), sum(j.flops_wall_s), min(j.hour), max(j.hour),
       sum(CASE
           WHEN wh.gpu_s > 0 THEN wh.energy_j * CASE WHEN j.wall_s < wh.gpu_s
                                                     THEN j.wall_s / wh.gpu_s ELSE 1 END
           WHEN h.observed_s > 0 THEN h.energy_j * CASE WHEN j.wall_s < h.observed_s
                                                        THEN j.wall_s / h.observed_s ELSE 1 END
           ELSE 0 END)
FROM telemetry_jobhour AS j
JOIN fleet_gpu AS g ON g.id = j.gpu_id
JOIN fleet_node AS n ON n.id = g.node_id
LEFT JOIN fleet_pool AS p ON p.id = n.pool_id
LEFT JOIN telemetry_hourlyusage AS h ON h.gpu_id = j.gpu_id AND h.hour = j.hour
LEFT JOIN telemetry_workloadhourlyusage AS wh
       ON wh.workload_id = j.workload_id AND wh.gpu_id = j.gpu_id AND wh.hour = j.hour
LEFT JOIN telemetry_workload AS w ON w.id = j.workload_id
WHERE j.hour >= %s AND j.hour < %s{workloads}
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11
"""

# (kind, key, user, account) of a workload → its team id by the [[workload_teams]] rules, or
# None (its GPU's pool's team): the caller's, since the rules live above telemetry.
TeamOf = Callable[[str, str, str, str], int | None]


def job_efficiency(
    *,
    start: dt.datetime,
    end: dt.datetime,
    group_by: str,
    peaks: Mapping[str, float] | None = None,
    team_of: TeamOf | None = None,
    workload_ids: Sequence[int] | None = None,
) -> list[EfficiencyRow]:
    """Rows of ``group_by`` (``workload``, ``model``, ``pool``, ``team``) over the hours in
    ``[start, end)``, most GPU hours first. ``peaks``: flops per second by catalogue key or
    NVML name (:func:`peak_flops`; default: the fleet file's ``[[peaks]]``, :func:`fleet_peaks`);
    ``team_of``: the workload team rules (default: none); ``workload_ids``: only the reports
    of these workloads (a page's rows)."""
    if group_by not in GROUP_BY and group_by != "fleet":  # fleet: one row of all (pages)
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}")
    from fleet.models import Pool, Team

    if peaks is None:
        peaks = fleet_peaks()
    params: list[Any] = [start, end]
    workloads = ""
    if workload_ids is not None:
        if not workload_ids:
            return []
        workloads = f" AND j.workload_id IN ({', '.join(['%s'] * len(workload_ids))})"
        params += list(workload_ids)
    with read_cursor() as cursor:  # the replica where pages read from one
        cursor.execute(_SUMS_SQL.format(workloads=workloads), params)
        rows = cursor.fetchall()
    pools = dict(Pool.objects.values_list("pk", "name")) if group_by == "pool" else {}
    teams = dict(Team.objects.values_list("pk", "name")) if group_by == "team" else {}
    peak_cache: dict[str, float | None] = {}
    # A group: (key, kind, workload id); a workload is its id (its key is unique per site and
    # kind only), other groups have neither kind nor id.
    groups: dict[tuple[str, str | None, int | None], list[float]] = {}
    parts: dict[tuple[str, str | None, int | None], dict[tuple[int, int | None], JobPart]] = {}
    for (
        workload_id,
        kind,
        wkey,
        user,
        account,
        model,
        gpu_name,
        pool_id,
        team_id,
        gpu_id,
        site_id,
        steps,
        samples,
        tokens,
        flops,
        wall_s,
        data_wait_s,
        ckpt_s,
        flops_wall_s,
        first_hour,
        last_hour,
        energy_j,
    ) in rows:
        key: tuple[str, str | None, int | None]
        if group_by == "workload":
            key = (wkey, kind, workload_id) if wkey is not None else (UNASSIGNED, None, None)
        elif group_by == "model":
            key = (model, None, None)
        elif group_by == "fleet":
            key = ("fleet", None, None)
        elif group_by == "pool":
            key = (pools.get(pool_id, UNASSIGNED), None, None)
        else:
            if team_of is not None and kind is not None:
                team_id = team_of(kind, wkey, user or "", account or "") or team_id
            key = (teams.get(team_id, UNASSIGNED), None, None)
        if gpu_name not in peak_cache:
            peak_cache[gpu_name] = peak_flops(gpu_name or "", peaks)
        peak = peak_cache[gpu_name]
        acc = groups.setdefault(key, [0.0] * 8)
        acc[0] += wall_s or 0.0
        acc[1] += steps or 0.0
        acc[2] += samples or 0.0
        acc[3] += tokens or 0.0
        acc[4] += data_wait_s or 0.0
        acc[5] += ckpt_s or 0.0
        if peak is not None and flops_wall_s:
            acc[6] += flops or 0.0
            acc[7] += peak * flops_wall_s
        first_hour, last_hour = _aware(first_hour), _aware(last_hour)
        group_parts = parts.setdefault(key, {})
        part = group_parts.get((gpu_id, site_id))
        if part is None:
            group_parts[(gpu_id, site_id)] = JobPart(
                gpu_id, site_id, first_hour, last_hour, wall_s or 0.0, energy_j or 0.0
            )
        else:
            part.first_hour = min(part.first_hour, first_hour)
            part.last_hour = max(part.last_hour, last_hour)
            part.wall_s += wall_s or 0.0
            part.energy_j += energy_j or 0.0
    out = [_row(group, acc, list(parts[group].values())) for group, acc in groups.items()]
    out.sort(key=lambda r: (-r.gpu_hours, r.key))
    return out


@dataclass(frozen=True)
class MeasuredTokens:
    """What the training loops of a pool (or of the fleet) measured: tokens per second per
    GPU while computing, and the GPU hours of reports it stands on."""

    tokens_per_s: float
    gpu_hours: float


def measured_tokens_per_s(
    *, pool: str | None, start: dt.datetime, end: dt.datetime
) -> MeasuredTokens | None:
    """The break-even's tokens per second per GPU as the jobs of ``pool`` (None: every pool)
    reported them over ``[start, end)``: Σ tokens / Σ (wall − data wait − checkpoint) seconds,
    the loops' time neither waiting for data nor checkpointing, when the GPU computes (the
    break-even counts tokens per second in the air and scales by utilisation). None without
    tokens."""
    rows = job_efficiency(start=start, end=end, group_by="pool")
    if pool is not None:
        rows = [r for r in rows if r.key == pool]
    tokens = sum(r.tokens for r in rows)
    busy_s = sum(
        r.gpu_hours * 3600.0 * (1.0 - (r.data_starved_share or 0.0) - (r.checkpoint_share or 0.0))
        for r in rows
    )
    if tokens <= 0 or busy_s <= 0:
        return None
    return MeasuredTokens(tokens / busy_s, sum(r.gpu_hours for r in rows))


def _aware(hour: Any) -> dt.datetime:
    """A raw cursor's hour as an aware UTC datetime (SQLite hands back text or naive values)."""
    moment: dt.datetime = dt.datetime.fromisoformat(hour) if isinstance(hour, str) else hour
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def _row(
    group: tuple[str, str | None, int | None], acc: list[float], parts: list[JobPart]
) -> EfficiencyRow:
    key, kind, workload_id = group
    wall_s, steps, samples, tokens, data_wait_s, ckpt_s, flops, peak_s = acc
    gpu_hours = wall_s / 3600.0
    return EfficiencyRow(
        key=key,
        kind=kind,
        workload_id=workload_id,
        gpu_hours=gpu_hours,
        steps=steps,
        samples=samples,
        tokens=tokens,
        mfu=flops / peak_s if peak_s > 0 else None,
        data_starved_share=data_wait_s / wall_s if wall_s > 0 else None,
        checkpoint_share=ckpt_s / wall_s if wall_s > 0 else None,
        tokens_per_gpu_hour=tokens / gpu_hours if gpu_hours > 0 else None,
        parts=parts,
    )
