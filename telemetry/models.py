"""Raw interval samples as agents send them, and their hourly rollups."""

from __future__ import annotations

from django.db import models

from fleet.models import Gpu, Node, Pool, Site, Team


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
    sm_active = models.FloatField(null=True)
    received_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["start"], name="telemetry_sample_start")]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} @ {self.start:%Y-%m-%d %H:%M} ({self.seconds} s)"


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
