"""Raw interval samples as agents send them, and their hourly rollups."""

from __future__ import annotations

from django.db import models
from django.db.models import Value
from django.db.models.functions import Coalesce

from fleet.models import Gpu, Node, Pool, Site, Team
from telemetry.fields import NumberArrayField

WORKLOAD_KINDS = ("slurm", "k8s", "container", "user")


class Sample(models.Model):
    """What one agent reported for one GPU over ``[start, start + seconds)`` (DESIGN.md §4).

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
    ``account`` and ``name`` are the latest the agents reported; first and last seen come from
    its samples (kept by the rollup)."""

    site = models.ForeignKey(Site, null=True, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=10, choices=[(k, k) for k in WORKLOAD_KINDS])
    key = models.CharField(max_length=200, help_text="The workload's id as the agent sent it")
    user_name = models.CharField(max_length=200, blank=True)
    account = models.CharField(max_length=200, blank=True)
    name = models.CharField(max_length=200, blank=True)
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


class HourlyUsage(models.Model):
    """One GPU over one UTC hour: the sums every figure of DESIGN.md §3 is built from.

    ``node``/``pool``/``team``/``site`` are the GPU's attribution as it was in that hour, so
    chargeback history does not move when the GPU does. Seconds, not hours, so sums stay exact.
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.DO_NOTHING, db_constraint=False)
    hour = models.DateTimeField()
    node = models.ForeignKey(
        Node, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    pool = models.ForeignKey(
        Pool, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    team = models.ForeignKey(
        Team, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    site = models.ForeignKey(
        Site, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    samples = models.IntegerField(default=0)
    observed_s = models.FloatField(default=0)
    air_s = models.FloatField(default=0)
    held_s = models.FloatField(default=0)
    parked_s = models.FloatField(default=0)
    energy_j = models.FloatField(default=0)
    idle_energy_j = models.FloatField(
        default=0, help_text="Energy of samples below the active threshold"
    )
    idle_s = models.FloatField(default=0, help_text="Seconds of samples below the active threshold")
    power_w_mean = models.FloatField(null=True)
    power_w_max = models.FloatField(null=True)
    temp_c_max = models.FloatField(null=True)
    util_pct_mean = models.FloatField(null=True)
    mem_util_pct_mean = models.FloatField(null=True)
    throttle_power_cap_s = models.FloatField(default=0)
    throttle_thermal_s = models.FloatField(default=0)
    throttle_hw_slowdown_s = models.FloatField(default=0)
    throttle_other_s = models.FloatField(default=0)
    throttle_any_s = models.FloatField(default=0)
    sm_active_s = models.FloatField(default=0, help_text="Σ sm_active × seconds")
    sm_observed_s = models.FloatField(default=0, help_text="Σ seconds of samples with sm_active")
    computed_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["gpu", "hour"], name="telemetry_hourly_gpu_hour")
        ]
        indexes = [models.Index(fields=["hour"], name="telemetry_hourly_hour")]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} @ {self.hour:%Y-%m-%d %H}h"


class RollupPending(models.Model):
    """An hour whose rollup is out of date. ``version`` grows with every mark, so a rollup
    clears only the marks it has seen and a sample that lands mid-rollup re-marks its hour."""

    hour = models.DateTimeField(primary_key=True)
    version = models.BigIntegerField(default=1)
    marked_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h v{self.version}"


class DailyUsage(models.Model):
    """One GPU over one local day of the report time zone, per attribution: the sums of its
    ``HourlyUsage`` rows of that day (a day whose GPU moved has one row per attribution).

    A read-side pre-aggregate, so period figures read 24× fewer rows (issue 6). On PostgreSQL
    statement triggers on ``telemetry_hourlyusage`` keep it equal to its hourly rows, in the
    same transaction as whatever wrote them (the rollup, the demo, a test); the day is that of
    ``DailyUsageState.zone``, and :func:`telemetry.rollup.daily_usage_rebuild` rebuilds it
    wholesale when the report time zone changes. Seconds and joules only: no money here.
    """

    gpu = models.ForeignKey(Gpu, on_delete=models.DO_NOTHING, db_constraint=False)
    day = models.DateField()
    node = models.ForeignKey(
        Node, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    pool = models.ForeignKey(
        Pool, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    team = models.ForeignKey(
        Team, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    site = models.ForeignKey(
        Site, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    hours = models.IntegerField(default=0, help_text="HourlyUsage rows summed here")
    samples = models.IntegerField(default=0)
    observed_s = models.FloatField(default=0)
    air_s = models.FloatField(default=0)
    held_s = models.FloatField(default=0)
    parked_s = models.FloatField(default=0)
    energy_j = models.FloatField(default=0)
    idle_energy_j = models.FloatField(default=0)
    idle_s = models.FloatField(default=0)
    throttle_power_cap_s = models.FloatField(default=0)
    throttle_thermal_s = models.FloatField(default=0)
    throttle_hw_slowdown_s = models.FloatField(default=0)
    throttle_other_s = models.FloatField(default=0)
    throttle_any_s = models.FloatField(default=0)
    sm_active_s = models.FloatField(default=0)
    sm_observed_s = models.FloatField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["gpu", "day"], name="telemetry_daily_gpu_day"),
            models.Index(fields=["day"], name="telemetry_daily_day"),
        ]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} @ {self.day:%Y-%m-%d}"


class DailyUsageState(models.Model):
    """The one row saying which time zone's days ``DailyUsage`` holds. No row (SQLite, or a
    flushed database): the table is not in use and the selectors read hourly rows."""

    zone = models.CharField(max_length=64)
    built_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"daily usage in {self.zone}"
