"""Raw interval samples as agents send them, and their hourly rollups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import models
from django.db.models import Value
from django.db.models.functions import Coalesce

from fleet.models import Gpu, Node, Pool, Site, Team
from telemetry.fields import NumberArrayField

WORKLOAD_KINDS = ("slurm", "k8s", "container", "user")


@dataclass(frozen=True)
class RollupColumn:
    """One value column of the hourly rollup, and how the rollup computes it from raw samples.

    ``hourly`` is the hour's value: an SQL aggregate over the rollup's per-sample rows, which
    carry the rules of docs/metrics.md under these names (``telemetry/sql/rollup_upsert.*.sql``,
    the ``per`` CTE): ``d`` (seconds), ``air``, ``held``, ``idle``, ``energy``, ``has_power``,
    ``thr_any``, and the sample's ``util_pct``, ``mem_util_pct``, ``power_w``, ``temp_c``,
    ``sm_active``. ``sample`` is an extra per-sample value that ``hourly`` reads under the
    column's own name: an SQL expression over the raw sample ``s`` and its GPU ``g``. Both are
    constants written into the statement (never values), and must read the same on PostgreSQL
    and SQLite.
    """

    name: str
    hourly: str
    sample: str = ""
    help_text: str = ""
    integer: bool = False


# held seconds of a sample with workloads: their shares beyond the air time, within its non-air
# time (the same text in both dialects: GREATEST/LEAST are PostgreSQL's, max/min SQLite's,
# hence plain CASE).
_WORKLOAD_HELD = (
    "(CASE WHEN share - air <= 0 THEN 0 WHEN share - air >= d - air THEN d - air"
    " ELSE share - air END)"
)

# The usage sums: every figure of docs/metrics.md is built from these. Each is a column of
# HourlyUsage (the hour's value, ``hourly``) and of DailyUsage (the sum of its hours), and the
# one list that the models, the rollup's statements, the daily rebuild and trigger, and the
# billing selectors read. To add one:
#   1. add a RollupColumn here: its name, its hourly aggregate, and in ``sample`` its
#      per-sample value where it reads a sample field the rules do not carry;
#   2. ``python manage.py makemigrations telemetry -n <name>``: the field on both tables;
#   3. in that migration, as in 0103_usage_sums: REFRESH_SQL = the text that
#      ``python manage.py shell -v 0 -c "from telemetry.rollup import daily_refresh_function_sql as
#      f; print(f())"`` prints (frozen there), installed by a RunPython on PostgreSQL, with the
#      previous migration's REFRESH_SQL as the reverse; tests/telemetry/test_usage_sums.py
#      fails until the database's trigger function is the generated one;
#   4. after deploying, ``python manage.py rollup --all`` fills it in for the hours raw
#      retention still holds (older hours keep 0).
USAGE_SUMS: tuple[RollupColumn, ...] = (
    RollupColumn("samples", "count(*)", integer=True),
    RollupColumn("observed_s", "sum(d)"),
    RollupColumn("air_s", "sum(air)"),
    # The rest of the interval is d − air (= (1 − u) × d when active_s is not sent), so
    # air + held + parked is exactly the observed time. With workloads (``share``: their
    # Σ share_s), held = clamp(share − air, 0, d − air); without, all or nothing by procs or
    # memory (``held``). Written out per case, so a sample without workloads adds exactly what
    # it always added.
    RollupColumn(
        "held_s",
        "sum(CASE WHEN share IS NOT NULL THEN "
        + _WORKLOAD_HELD
        + " WHEN held THEN d - air ELSE 0 END)",
    ),
    RollupColumn(
        "parked_s",
        "sum(CASE WHEN share IS NOT NULL THEN d - air - "
        + _WORKLOAD_HELD
        + " WHEN held THEN 0 ELSE d - air END)",
    ),
    RollupColumn("energy_j", "sum(energy)"),
    RollupColumn(
        "idle_energy_j",
        "sum(CASE WHEN idle THEN energy ELSE 0 END)",
        help_text="Energy of samples below the active threshold",
    ),
    RollupColumn(
        "idle_s",
        "sum(CASE WHEN idle THEN d ELSE 0 END)",
        help_text="Seconds of samples below the active threshold",
    ),
    RollupColumn(
        "throttle_power_cap_s",
        "sum(throttle_power_cap_s)",
        sample="COALESCE(s.throttle_power_cap_s, 0)",
    ),
    RollupColumn(
        "throttle_thermal_s", "sum(throttle_thermal_s)", sample="COALESCE(s.throttle_thermal_s, 0)"
    ),
    RollupColumn(
        "throttle_hw_slowdown_s",
        "sum(throttle_hw_slowdown_s)",
        sample="COALESCE(s.throttle_hw_slowdown_s, 0)",
    ),
    RollupColumn(
        "throttle_other_s", "sum(throttle_other_s)", sample="COALESCE(s.throttle_other_s, 0)"
    ),
    RollupColumn("throttle_any_s", "sum(thr_any)"),
    # Profiling (docs/metrics.md, "Work"): means over p = prof_s (else the interval's seconds).
    RollupColumn(
        "sm_active_s",
        "COALESCE(sum(sm_active * p), 0)",
        help_text="Σ sm_active × prof_s: work seconds",
    ),
    RollupColumn(
        "sm_observed_s",
        "sum(CASE WHEN sm_active IS NOT NULL THEN p ELSE 0 END)",
        help_text="Σ prof_s of samples with sm_active",
    ),
    RollupColumn(
        "sm_air_s",
        "sum(CASE WHEN sm_active IS NOT NULL THEN air ELSE 0 END)",
        help_text="Σ air seconds of samples with sm_active (busy but not working = this − work)",
    ),
    RollupColumn(
        "tensor_active_s",
        "COALESCE(sum(tensor_active * p), 0)",
        help_text="Σ tensor_active × prof_s",
    ),
    RollupColumn(
        "tensor_observed_s",
        "sum(CASE WHEN tensor_active IS NOT NULL THEN p ELSE 0 END)",
        help_text="Σ prof_s of samples with tensor_active",
    ),
    RollupColumn(
        "sm_hours",
        "CASE WHEN count(sm_active) > 0 THEN 1 ELSE 0 END",
        help_text="Hours with sm_active data (1 per hourly row that has any)",
        integer=True,
    ),
    RollupColumn(
        "sm_hours_energy_j",
        "CASE WHEN count(sm_active) > 0 THEN sum(energy) ELSE 0 END",
        help_text="Energy of the hours with sm_active data (cost per work hour)",
    ),
)
USAGE_SUM_COLUMNS: tuple[str, ...] = tuple(c.name for c in USAGE_SUMS)

# The hourly rollup's other values: means and maxima of the hour. A day's value is not the sum
# of its hours', so DailyUsage has none of them (the fields are declared on HourlyUsage).
HOURLY_STATS: tuple[RollupColumn, ...] = (
    RollupColumn(
        "power_w_mean", "sum(energy) / NULLIF(sum(CASE WHEN has_power THEN d ELSE 0 END), 0)"
    ),
    RollupColumn("power_w_max", "max(power_w)"),
    RollupColumn("temp_c_max", "max(temp_c)"),
    RollupColumn("util_pct_mean", "sum(util_pct * d) / sum(d)"),
    RollupColumn(
        "mem_util_pct_mean",
        "sum(mem_util_pct * d)"
        " / NULLIF(sum(CASE WHEN mem_util_pct IS NOT NULL THEN d ELSE 0 END), 0)",
    ),
    RollupColumn(
        "sm_occupancy_mean",
        "sum(sm_occupancy * p)"
        " / NULLIF(sum(CASE WHEN sm_occupancy IS NOT NULL THEN p ELSE 0 END), 0)",
    ),
    RollupColumn(
        "dram_active_mean",
        "sum(dram_active * p)"
        " / NULLIF(sum(CASE WHEN dram_active IS NOT NULL THEN p ELSE 0 END), 0)",
    ),
)


class UsageSums(models.Model):
    """The usage sums of one GPU over a period (an hour, a local day): one field per entry of
    ``USAGE_SUMS``, made from it. Seconds and joules, not hours, so sums stay exact."""

    class Meta:
        abstract = True


for _column in USAGE_SUMS:
    _field = models.IntegerField if _column.integer else models.FloatField
    UsageSums.add_to_class(_column.name, _field(default=0, help_text=_column.help_text))


def _attribution_fk(to: type[models.Model], *, db_index: bool = True) -> Any:
    return models.ForeignKey(
        to,
        null=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
        db_index=db_index,
    )


class Attribution(models.Model):
    """Where a GPU belonged in the period of a row (its node, pool, team, site then), so
    chargeback history does not move when the GPU does. No database FKs: the rollups are
    written in bulk by SQL, and inventory rows are never deleted while history points at them."""

    node = _attribution_fk(Node)
    pool = _attribution_fk(Pool)
    team = _attribution_fk(Team)
    site = _attribution_fk(Site)

    class Meta:
        abstract = True


class UnindexedAttribution(models.Model):
    """:class:`Attribution` without an index on each column: the workload rollups, several
    rows per GPU-hour rewritten by every rollup, are read by hour, workload or GPU, never
    looked up by node, pool, team or site alone (each index cost their upsert a tenth)."""

    node = _attribution_fk(Node, db_index=False)
    pool = _attribution_fk(Pool, db_index=False)
    team = _attribution_fk(Team, db_index=False)
    site = _attribution_fk(Site, db_index=False)

    class Meta:
        abstract = True


class Sample(models.Model):
    """What one agent reported for one GPU over ``[start, start + seconds)`` (docs/ingest.md).

    Keyed by ``(gpu, start)`` so a replayed sample changes nothing. On PostgreSQL the table is
    range-partitioned by ``start`` (see the telemetry migrations); values are stored as sent,
    and every fallback (energy from power, held from memory) is applied by the rollup.
    """

    pk = models.CompositePrimaryKey("gpu_id", "start")
    # No database FK: ingest has checked the GPU, and a constraint check per row would cost
    # COPY a third of its speed on the hottest table.
    gpu = models.ForeignKey(Gpu, on_delete=models.DO_NOTHING, db_constraint=False)
    start = models.DateTimeField()
    seconds = models.PositiveSmallIntegerField()
    util_pct = models.FloatField()
    mem_util_pct = models.FloatField(null=True)
    mem_used_bytes = models.BigIntegerField(null=True)
    procs = models.SmallIntegerField(null=True)
    power_w = models.FloatField(null=True)
    energy_j = models.FloatField(null=True)
    temp_c = models.FloatField(null=True)
    sm_clock_mhz = models.FloatField(null=True)
    throttle_power_cap_s = models.FloatField(null=True)
    throttle_thermal_s = models.FloatField(null=True)
    throttle_hw_slowdown_s = models.FloatField(null=True)
    throttle_other_s = models.FloatField(null=True)
    throttle_any_s = models.FloatField(null=True)
    active_s = models.FloatField(null=True)
    # Profiling means over prof_s seconds of the interval (NVML GPM or dcgm-exporter), 0–1.
    sm_active = models.FloatField(null=True)
    sm_occupancy = models.FloatField(null=True)
    tensor_active = models.FloatField(null=True)
    dram_active = models.FloatField(null=True)
    prof_s = models.FloatField(null=True, help_text="Seconds the profiling means cover")
    # The workloads that held the GPU (docs/metrics.md, "Workloads"): parallel arrays, null
    # when the agent sent no workloads (then held/parked follow processes and memory).
    workload_ids = NumberArrayField(base="int8", null=True)
    workload_share_s = NumberArrayField(base="float8", null=True)
    workload_air_s = NumberArrayField(base="float8", null=True)
    received_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["start"], name="telemetry_sample_start")]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} @ {self.start:%Y-%m-%d %H:%M} ({self.seconds} s)"


class Workload(models.Model):
    """What held GPUs (docs/metrics.md, "Workloads"): a Slurm job, a Kubernetes pod, a
    container or, where no scheduler is involved, a Unix user. One row per (site of the
    reporting node, kind, id): the same job id at two sites is two workloads. ``user``,
    ``account`` and ``name`` are the latest non-empty ones that ``identity_node`` (the first
    node to report the workload) sent; what other nodes claim instead is kept beside it in
    :class:`WorkloadClaim` (docs/ingest.md, "Whose names count"). First and last seen come
    from its samples (kept by the rollup)."""

    site = models.ForeignKey(Site, null=True, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=10, choices=[(k, k) for k in WORKLOAD_KINDS])
    key = models.CharField(max_length=200, help_text="The workload's id as the agent sent it")
    user_name = models.CharField(max_length=200, blank=True)
    account = models.CharField(max_length=200, blank=True)
    name = models.CharField(max_length=200, blank=True)
    # Null only for a workload registered before identities had an owner and never seen in a
    # rollup since (migration 0111): the next node to report it adopts it.
    identity_node = models.ForeignKey(
        Node,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The node whose reports set user, account and name: the first to report it",
    )
    first_seen_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # A node without a site reports workloads of site 0: one identity, not NULL ≠ NULL.
            models.UniqueConstraint(
                Coalesce("site", Value(0)), "kind", "key", name="telemetry_workload_identity"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"


WORKLOAD_CLAIM_FIELDS = ("user", "account", "name")


class WorkloadClaim(models.Model):
    """One value that a node other than the workload's ``identity_node`` sent for one of its
    names (``field``: user, account or name) where it differs from the stored one: kept
    beside the identity, never over it, and shown on the workload's page. One row per
    (workload, node, field, value), with when the node first and last sent it (last seen to
    ``telemetry.ingest_store.CLAIM_SEEN_RESOLUTION``)."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="claims")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    field = models.CharField(max_length=10, choices=[(f, f) for f in WORKLOAD_CLAIM_FIELDS])
    value = models.CharField(max_length=200)
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["workload", "node", "field", "value"], name="telemetry_workload_claim"
            )
        ]

    def __str__(self) -> str:
        return f"workload {self.workload_id}: node {self.node_id} says {self.field}={self.value}"


class WorkloadRegistrations(models.Model):
    """How many new workloads one node's pushes registered in one UTC hour: what the hourly
    cap ``INGEST_MAX_NEW_WORKLOADS_PER_HOUR`` is checked against (docs/ingest.md). Only
    capped pushes (the ingest API) count, so the demo's history, written through the service
    in minutes, leaves its live agents their hour. Ingest keeps one or two rows per node: it
    deletes a node's past hours when it counts a new one."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()
    registered = models.IntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "hour"], name="telemetry_workload_regs_hour")
        ]

    def __str__(self) -> str:
        return f"node {self.node_id} @ {self.hour:%Y-%m-%d %H}h: {self.registered} new workloads"


class HourlyUsage(UsageSums, Attribution):
    """One GPU over one UTC hour: the sums every figure of docs/metrics.md is built from
    (``USAGE_SUMS``), and the hour's means and maxima (``HOURLY_STATS``).

    ``node``/``pool``/``team``/``site`` are the GPU's attribution as it was in that hour, so
    chargeback history does not move when the GPU does. Seconds, not hours, so sums stay exact.
    """

    # Looked up by the unique (gpu, hour), whose first column it is: no index of its own.
    gpu = models.ForeignKey(Gpu, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False)
    hour = models.DateTimeField()
    power_w_mean = models.FloatField(null=True)
    power_w_max = models.FloatField(null=True)
    temp_c_max = models.FloatField(null=True)
    util_pct_mean = models.FloatField(null=True)
    mem_util_pct_mean = models.FloatField(null=True)
    sm_occupancy_mean = models.FloatField(null=True, help_text="Mean over prof_s, 0–1")
    dram_active_mean = models.FloatField(null=True, help_text="Mean over prof_s, 0–1")
    computed_at = models.DateTimeField()

    class Meta:
        # The rollup rewrites the open hour's row every minute, changing no indexed column,
        # so each rewrite can be a HOT update (no index entry written) when the row's page
        # has room for the new version: the table is stored with fillfactor 50 (migration
        # 0114_rollup_wal; Django has no option for it), as are DailyUsage and MonthlyUsage.
        constraints = [
            models.UniqueConstraint(fields=["gpu", "hour"], name="telemetry_hourly_gpu_hour")
        ]
        indexes = [models.Index(fields=["hour"], name="telemetry_hourly_hour")]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} @ {self.hour:%Y-%m-%d %H}h"


class WorkloadHourlyUsage(UnindexedAttribution):
    """One workload on one GPU over one UTC hour: the sums its figures are built from (docs/
    metrics.md, "Workloads"). ``gpu_s`` is Σ share_s, ``air_s`` Σ air_s and ``energy_j`` Σ the
    sample's energy × share_s / seconds. ``node``/``pool``/``team``/``site`` are the GPU's
    attribution in that hour, as its HourlyUsage row holds it. Kept by the same rollup run as
    HourlyUsage (telemetry/sql/rollup_workloads.*.sql). Seconds and joules only: no money."""

    # The unique (gpu, hour, workload) serves lookups by GPU; by workload, the daily rows'.
    workload = models.ForeignKey(
        Workload, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False
    )
    gpu = models.ForeignKey(Gpu, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False)
    hour = models.DateTimeField()
    samples = models.IntegerField(default=0)
    gpu_s = models.FloatField(default=0, help_text="Σ share_s: the workload's GPU seconds")
    air_s = models.FloatField(default=0, help_text="Σ air_s")
    energy_j = models.FloatField(default=0, help_text="Σ energy × share_s / seconds")
    computed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "hour", "workload"], name="telemetry_workload_gpu_hour"
            )
        ]
        indexes = [models.Index(fields=["hour"], name="telemetry_workload_hour")]

    def __str__(self) -> str:
        return f"workload {self.workload_id} on gpu {self.gpu_id} @ {self.hour:%Y-%m-%d %H}h"


class WorkloadDailyUsage(UnindexedAttribution):
    """One workload on one GPU over one local day of the report time zone, per attribution:
    the sums of its ``WorkloadHourlyUsage`` rows of that day. A read-side pre-aggregate, so
    the Workloads page reads a row per job-day rather than per job-hour, as ``DailyUsage`` is
    for the GPUs' rollups. ``held_energy_j`` is Σ over the hourly rows of energy × held / GPU
    seconds (idle money is priced per hour's held share: docs/metrics.md, "Workloads").

    Kept by the rollup in the same transaction as the hourly rows it sums (the local days a
    batch touched are summed again, on both dialects); the day is that of
    ``WorkloadDailyState.zone``, and :func:`telemetry.rollup.workload_daily_rebuild` rebuilds
    it when the report time zone changes. Seconds and joules only: no money here."""

    workload = models.ForeignKey(Workload, on_delete=models.DO_NOTHING, db_constraint=False)
    gpu = models.ForeignKey(Gpu, on_delete=models.DO_NOTHING, db_constraint=False)
    day = models.DateField()
    hours = models.IntegerField(default=0, help_text="WorkloadHourlyUsage rows summed here")
    gpu_s = models.FloatField(default=0)
    air_s = models.FloatField(default=0)
    energy_j = models.FloatField(default=0)
    held_energy_j = models.FloatField(default=0, help_text="Σ energy × held / GPU seconds")

    class Meta:
        indexes = [models.Index(fields=["day"], name="telemetry_workload_daily_day")]

    def __str__(self) -> str:
        return f"workload {self.workload_id} on gpu {self.gpu_id} @ {self.day:%Y-%m-%d}"


class WorkloadNodeDailyUsage(UnindexedAttribution):
    """One workload on one node over one local day, per attribution: the sums of its
    ``WorkloadDailyUsage`` rows of that day, with the GPUs they cover (``gpu_ids``, sorted). A
    job holds its node's GPUs together, so this is a row per job-day rather than per
    job-GPU-day (56,000 rows instead of 448,000 for 45,000 jobs of 8 GPUs over 90 days): the
    Workloads page ranks every workload of the window from it, wherever its GPUs all have one
    rate (billing/workload_page.py). PostgreSQL only; kept and rebuilt with
    ``WorkloadDailyUsage`` (telemetry.rollup). Seconds and joules only: no money here."""

    workload = models.ForeignKey(
        Workload, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False
    )
    day = models.DateField()
    gpu_ids = NumberArrayField(base="int8")
    gpu_s = models.FloatField(default=0)
    air_s = models.FloatField(default=0)
    energy_j = models.FloatField(default=0)
    held_energy_j = models.FloatField(default=0)

    class Meta:
        indexes = [models.Index(fields=["day"], name="telemetry_workload_node_day")]

    def __str__(self) -> str:
        return f"workload {self.workload_id} on node {self.node_id} @ {self.day:%Y-%m-%d}"


class WorkloadDailyState(models.Model):
    """The one row saying which time zone's days ``WorkloadDailyUsage`` holds. No row (a
    flushed database, rows written other than by the rollup): the table is not in use and the
    workload figures read hourly rows."""

    zone = models.CharField(max_length=64)
    built_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"workload daily usage in {self.zone}"


class RollupPending(models.Model):
    """An hour whose rollup is out of date. ``version`` grows with every mark, so a rollup
    clears only the marks it has seen and a sample that lands mid-rollup re-marks its hour.

    An hour whose recompute fails for a reason that is not transient counts a failure; after
    ``ROLLUP_MAX_FAILURES`` it is set aside: the rollup passes it by, so it no longer holds up
    the hours after it, until an operator puts it back in the queue (admin). Marking it again
    does not put it back: its samples still fail.
    """

    hour = models.DateTimeField(primary_key=True)
    version = models.BigIntegerField(default=1)
    marked_at = models.DateTimeField(auto_now=True)
    # Database defaults: ingest inserts marks in its own statements, naming only the columns
    # above (telemetry.pending.MARK_INSERT).
    failures = models.IntegerField(
        default=0, db_default=0, help_text="Failed recomputes since it was last put in the queue"
    )
    last_error = models.TextField(blank=True, default="", db_default="")
    failed_at = models.DateTimeField(null=True, blank=True)
    set_aside_at = models.DateTimeField(
        null=True, blank=True, help_text="Set aside after too many failures; the rollup skips it"
    )

    class Meta:
        verbose_name = "rollup mark"

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h v{self.version}"


class DailyUsage(UsageSums, Attribution):
    """One GPU over one local day of the report time zone, per attribution: the sums of its
    ``HourlyUsage`` rows of that day (a day whose GPU moved has one row per attribution).

    A read-side pre-aggregate, so period figures read 24× fewer rows (issue 6). On PostgreSQL
    statement triggers on ``telemetry_hourlyusage`` keep it equal to its hourly rows, in the
    same transaction as whatever wrote them (the rollup, the demo, a test); the day is that of
    ``DailyUsageState.zone``, and :func:`telemetry.rollup.daily_usage_rebuild` rebuilds it
    wholesale when the report time zone changes. Seconds and joules only: no money here.
    """

    # Looked up by (gpu, day), whose first column it is: no index of its own.
    gpu = models.ForeignKey(Gpu, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False)
    day = models.DateField()
    hours = models.IntegerField(default=0, help_text="HourlyUsage rows summed here")

    class Meta:
        # No index may name a column the rollup changes (hours, the sums), or no rewrite of
        # the day's row could be a HOT update: the partial index of the days that observed
        # more than their hours (observed_s > hours × 3600) is gone (issue 46), and no query
        # used it (its one reader writes 3600 × hours, which the planner does not match).
        indexes = [
            models.Index(fields=["gpu", "day"], name="telemetry_daily_gpu_day"),
            models.Index(fields=["day"], name="telemetry_daily_day"),
        ]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} @ {self.day:%Y-%m-%d}"


class MonthlyUsage(UsageSums, Attribution):
    """One GPU over one local calendar month of the report time zone, per attribution: the
    sums of its ``DailyUsage`` rows of that month (so of its hourly rows).

    A read-side pre-aggregate beside the daily one (issue 19): a year's figures per GPU read
    12 rows instead of 365. Kept by the same trigger function as ``DailyUsage``, right after
    the days it refreshed, in the same transaction (months of the days touched), and rebuilt
    with it (:func:`telemetry.rollup.daily_usage_rebuild`); in the same zone
    (``DailyUsageState``). Seconds and joules only: no money here.
    """

    # Looked up by (gpu, month), whose first column it is: no index of its own.
    gpu = models.ForeignKey(Gpu, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False)
    month = models.DateField(help_text="The month's first day")
    hours = models.IntegerField(default=0, help_text="HourlyUsage rows summed here")

    class Meta:
        indexes = [
            models.Index(fields=["gpu", "month"], name="telemetry_monthly_gpu_month"),
            models.Index(fields=["month"], name="telemetry_monthly_month"),
        ]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} @ {self.month:%Y-%m}"


class DailyUsageState(models.Model):
    """The one row saying which time zone's days ``DailyUsage`` holds. No row (SQLite, or a
    flushed database): the table is not in use and the selectors read hourly rows."""

    zone = models.CharField(max_length=64)
    built_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"daily usage in {self.zone}"


# --- queue pressure (DESIGN.md §9.2, docs/ingest.md "Queue") -----------------------------------
QUEUE_KINDS = ("slurm", "k8s")
QUEUE_CLASSES = ("capacity", "policy", "user")


class QueueCluster(models.Model):
    """One batch cluster (a Slurm cluster, a Kubernetes cluster) whose pending GPU jobs an
    agent pushes to ``POST /api/v1/queue``. ``node`` owns it: the first node to push for it
    (or, after its node was deleted, the next one); another node's push is refused.
    ``last_at`` is the time of the latest snapshot applied: the start of the next interval,
    and what makes a resent snapshot change nothing."""

    name = models.CharField(max_length=100, unique=True)
    node = models.ForeignKey(
        Node,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The node whose agent pushes this cluster's queue: the first to push it",
    )
    last_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.name


class QueuePartition(models.Model):
    """One ``[[partitions]]`` entry of the fleet file: a partition (Slurm partition, queue)
    of a cluster and the pools whose GPUs its jobs would run on. The rows are exactly those
    of the fleet file (``telemetry.queue.queue_partitions_apply``); pending stretches name
    their partition as text, so dropping an entry loses no history."""

    cluster = models.ForeignKey(QueueCluster, on_delete=models.CASCADE, related_name="partitions")
    name = models.CharField(max_length=100)
    pools = models.ManyToManyField(Pool, related_name="+", blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="telemetry_queue_partition")
        ]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.name}"


class PendingStretch(models.Model):
    """One job's stretch of pending with the same user, account, partition, GPUs, GPU model
    and reason class, from the first snapshot that listed it so to the first that did not
    (``ended_at``; null while it is still pending). A change of any of those closes the
    stretch (``split``) and opens the next, which carries the job's ``wait_started_at``: a
    job's wait is that of its chain's last stretch (``split`` false). ``last_seen_at`` is
    written when the stretch closes; while open it is its cluster's ``last_at``. The reason
    text, submit and eligible times are the latest sent."""

    cluster = models.ForeignKey(QueueCluster, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=10, choices=[(k, k) for k in QUEUE_KINDS])
    job_id = models.CharField(max_length=200)
    user_name = models.CharField(max_length=200, blank=True)
    account = models.CharField(max_length=200, blank=True)
    partition = models.CharField(max_length=200, blank=True)
    gpus = models.PositiveIntegerField()
    gpu_model = models.CharField(max_length=100, blank=True)
    reason_class = models.CharField(max_length=10, choices=[(c, c) for c in QUEUE_CLASSES])
    reason = models.CharField(max_length=200)
    submitted_at = models.DateTimeField(null=True, blank=True)
    eligible_at = models.DateTimeField(null=True, blank=True)
    wait_started_at = models.DateTimeField()
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    split = models.BooleanField(default=False)

    class Meta:
        constraints = [
            # At most one open stretch per job: what a snapshot is compared against.
            models.UniqueConstraint(
                fields=["cluster", "kind", "job_id"],
                condition=models.Q(ended_at__isnull=True),
                name="telemetry_pending_open",
            )
        ]
        indexes = [
            models.Index(fields=["wait_started_at"], name="telemetry_pending_wait_start"),
            models.Index(fields=["ended_at"], name="telemetry_pending_ended"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.job_id} pending from {self.first_seen_at:%Y-%m-%d %H:%M}"


class QueueWaitHourly(models.Model):
    """GPU-seconds waited in one UTC hour by the pending jobs of one (cluster, partition,
    account, user, reason class): Σ gpus × Δt over the intervals between snapshots, Δt
    capped at ``telemetry.queue.INTERVAL_CAP_S``. Added to at each snapshot, never
    recomputed."""

    cluster = models.ForeignKey(QueueCluster, on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField()
    partition = models.CharField(max_length=200, blank=True)
    account = models.CharField(max_length=200, blank=True)
    user_name = models.CharField(max_length=200, blank=True)
    reason_class = models.CharField(max_length=10, choices=[(c, c) for c in QUEUE_CLASSES])
    gpu_seconds = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "hour", "partition", "account", "user_name", "reason_class"],
                name="telemetry_queue_wait_hour",
            )
        ]
        indexes = [models.Index(fields=["hour"], name="telemetry_queue_wait_hour_idx")]

    def __str__(self) -> str:
        return f"{self.cluster_id} {self.partition} @ {self.hour:%Y-%m-%d %H}h"


# --- job efficiency (DESIGN.md §9.4, docs/ingest.md "job") --------------------------------------
class JobHour(models.Model):
    """What the training loop of one workload reported for one GPU over one UTC hour, under
    one model name: the sums of the ``job`` of its samples (docs/ingest.md), added by ingest in
    the samples' own transaction (a duplicate sample adds nothing). Counts are this GPU's part
    of the job's (the agent splits them over the job's GPUs); times are the job's wall, data
    wait, compute and checkpoint seconds on this GPU, so Σ ``wall_s`` is GPU seconds.
    ``flops_wall_s``: the wall seconds of the samples whose job gave flops (MFU's
    denominator). ``workload`` null: a sample without workloads."""

    gpu = models.ForeignKey(Gpu, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False)
    hour = models.DateTimeField()
    workload = models.ForeignKey(
        Workload, null=True, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False
    )
    model = models.CharField(max_length=200)
    reports = models.IntegerField(default=0, help_text="Samples whose job was added here")
    steps = models.FloatField(default=0)
    samples = models.FloatField(default=0)
    tokens = models.FloatField(default=0)
    flops = models.FloatField(default=0)
    ckpt_bytes = models.FloatField(default=0)
    wall_s = models.FloatField(default=0)
    data_wait_s = models.FloatField(default=0)
    compute_s = models.FloatField(default=0)
    ckpt_s = models.FloatField(default=0)
    flops_wall_s = models.FloatField(default=0)

    class Meta:
        constraints = [
            # Coalesce: a sample without workloads adds to one row, not one per NULL.
            models.UniqueConstraint(
                "gpu",
                "hour",
                Coalesce("workload", Value(0)),
                "model",
                name="telemetry_jobhour_key",
            )
        ]
        indexes = [models.Index(fields=["hour"], name="telemetry_jobhour_hour")]

    def __str__(self) -> str:
        return f"{self.model} on gpu {self.gpu_id} @ {self.hour:%Y-%m-%d %H}h"


# --- MIG (DESIGN.md §9.5; docs/ingest.md, "mig" and "instance") ---------------------------------
class MigInstance(models.Model):
    """A MIG instance of a GPU, as the GPU's ``mig`` block named it. A MIG UUID is new for
    every instance created, so a reconfigured GPU gets new rows; those destroyed keep theirs
    (``gone_at``: first push whose block no longer listed it), with the samples they have."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="mig_instances")
    uuid = models.CharField(max_length=100, unique=True)
    gi = models.SmallIntegerField(help_text="GPU instance id")
    ci = models.SmallIntegerField(help_text="Compute instance id")
    profile = models.CharField(max_length=50, help_text="NVIDIA's profile name, e.g. 3g.40gb")
    slices = models.SmallIntegerField(help_text="The GPU instance's slices")
    memory_mb = models.BigIntegerField()
    gpu_slices = models.SmallIntegerField(default=7, help_text="The GPU's slices (mig_slices)")
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    gone_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.profile} {self.uuid} on gpu {self.gpu_id}"


class InstanceSample(models.Model):
    """One MIG instance over ``[start, start + seconds)`` (a sample with ``instance``).

    Its own table, not rows of ``Sample``: the GPU's samples stay one per (gpu, start), so
    every reader of them (rollups, selectors) counts each GPU second once, and the GPU's own
    sample already carries the slice-weighted utilisation and workload shares (docs/agent.md,
    "MIG"). ``slices`` and ``gpu_slices`` are the instance's at ingest, so its share of the
    GPU (slices / gpu_slices) is fixed with the sample."""

    pk = models.CompositePrimaryKey("instance_id", "start")
    instance = models.ForeignKey(MigInstance, on_delete=models.DO_NOTHING, db_constraint=False)
    gpu = models.ForeignKey(
        Gpu, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", db_index=False
    )
    start = models.DateTimeField()
    seconds = models.PositiveSmallIntegerField()
    slices = models.SmallIntegerField()
    gpu_slices = models.SmallIntegerField()
    util_pct = models.FloatField()
    mem_used_bytes = models.BigIntegerField(null=True)
    procs = models.SmallIntegerField(null=True)
    active_s = models.FloatField(null=True)
    sm_active = models.FloatField(null=True)
    sm_occupancy = models.FloatField(null=True)
    tensor_active = models.FloatField(null=True)
    dram_active = models.FloatField(null=True)
    prof_s = models.FloatField(null=True)
    workload_ids = NumberArrayField(base="int8", null=True)
    workload_share_s = NumberArrayField(base="float8", null=True)
    workload_air_s = NumberArrayField(base="float8", null=True)
    received_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["start"], name="telemetry_instsample_start"),
            models.Index(fields=["gpu", "start"], name="telemetry_instsample_gpu"),
        ]

    def __str__(self) -> str:
        return f"instance {self.instance_id} @ {self.start:%Y-%m-%d %H:%M} ({self.seconds} s)"


class InstanceHourlyUsage(models.Model):
    """A MIG instance's hour (the rollup target for InstanceSample; docs/metrics.md): seconds
    of the instance, and ``slice_s`` = Σ seconds × slices / gpu_slices, its share of the GPU's
    time, by which the GPU-hour's cost and energy are split."""

    instance = models.ForeignKey(MigInstance, on_delete=models.DO_NOTHING, db_constraint=False)
    gpu = models.ForeignKey(
        Gpu, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+", db_index=False
    )
    hour = models.DateTimeField()
    samples = models.IntegerField(default=0)
    observed_s = models.FloatField(default=0)
    slice_s = models.FloatField(default=0)
    air_s = models.FloatField(default=0)
    held_s = models.FloatField(default=0)
    parked_s = models.FloatField(default=0)
    sm_active_s = models.FloatField(default=0)
    sm_observed_s = models.FloatField(default=0)
    computed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["instance", "hour"], name="telemetry_insthour_key")
        ]
        indexes = [models.Index(fields=["gpu", "hour"], name="telemetry_insthour_gpu_hour")]

    def __str__(self) -> str:
        return f"instance {self.instance_id} @ {self.hour:%Y-%m-%d %H}h"
