"""The rule registry: what each ``rule`` of ``[[alerts]]`` measures (docs/alerts.md).

A rule kind is a function from (the rule as configured, its window, now) to a list of
measurements, one ``(subject, value)`` per subject in the rule's scope that has a value; the
evaluator (``alerts.services``) compares each value with the threshold and keeps the alerts'
state. A new kind (``workload_held_hours`` once workloads exist) is one more
``rule_kind_register(RuleKind(...))``: nothing else changes.

Every figure comes from somewhere that already defines it: money and utilisation from
``billing.selectors`` (the dashboard's and the API's functions), GPU hours from the hourly
rollups, silence from the GPU's ``last_seen_at`` (``alerts.figures``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from alerts import figures

# Stored values keep six decimals (a millionth of an hour, of a share, of a currency unit).
PLACES = Decimal("0.000001")
MAX_WINDOW_HOURS = 2160  # 90 days: the longest look-back a rule may ask for
DEFAULT_WINDOW_HOURS = 24
SCOPE_KINDS = ("fleet", "site", "pool", "team", "gpu")

# Units of a rule's value and threshold.
HOURS = "h"
MINUTES = "min"
SHARE = "share"  # a fraction 0–1, shown as a percentage
MONEY = "money"  # the fleet's currency

# How a rule's window is laid out (RuleKind.window).
WINDOW_HOURS = "hours"  # the last window_hours whole hours
WINDOW_MONTH = "month"  # the month to date, in the report time zone
WINDOW_NOW = "now"  # a state at the moment of evaluation (no window)


def quantized(value: Decimal | float) -> Decimal:
    number = value if isinstance(value, Decimal) else Decimal(repr(float(value)))
    return number.quantize(PLACES, rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class Scope:
    """``fleet``, or ``site``/``pool``/``team``/``gpu`` and a name."""

    kind: str
    name: str = ""

    @classmethod
    def parse(cls, text: str) -> Scope:
        """ValueError for anything but the five scope forms of docs/alerts.md."""
        if text == "fleet":
            return cls("fleet")
        kind, sep, name = text.partition(":")
        if not sep or kind not in SCOPE_KINDS or kind == "fleet" or not name:
            raise ValueError("expected fleet, site:NAME, pool:NAME, team:NAME or gpu:UUID")
        return cls(kind, name)

    def __str__(self) -> str:
        return self.kind if self.kind == "fleet" else f"{self.kind}:{self.name}"


@dataclass(frozen=True)
class Window:
    """The span a rule looked at: [start, end), UTC."""

    start: dt.datetime
    end: dt.datetime

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600


@dataclass(frozen=True)
class RuleConfig:
    """A rule as the fleet file set it (``alerts.models.Rule`` without the bookkeeping)."""

    name: str
    kind: str
    scope: Scope
    threshold: Decimal
    window_hours: int | None = None
    notify: tuple[str, ...] = ()
    repeat_hours: int = 24


@dataclass(frozen=True)
class Measurement:
    """One subject's value: ``subject`` is ``gpu:UUID``, ``pool:NAME``, ``fleet``…; ``label``
    is what a person reads (a GPU's ``host#index``). ``since``: when the measured condition
    began, where the rule knows it (an offline GPU's last sample end); an alert opened on it
    fires since then, else since the evaluation that found it."""

    subject: str
    label: str
    value: Decimal
    since: dt.datetime | None = None


MeasureFn = Callable[[RuleConfig, Window, dt.datetime], list[Measurement]]
ThresholdCheck = Callable[[Decimal, int | None], str | None]


@dataclass(frozen=True)
class RuleKind:
    """What one ``rule = "…"`` means.

    ``above``: fires while value > threshold (else while value < threshold). ``check`` says
    what is wrong with a threshold, given the window in hours (None: fine). ``money``: the
    value is money (viewers do not see it). ``symbols``: symbolic ``notify`` entries this kind
    resolves per subject (``owner`` for workload rules, ``alerts.targets``).
    """

    name: str
    measure: MeasureFn
    unit: str
    window: str
    above: bool
    check: ThresholdCheck
    what: str  # "held hours of each GPU in the window": pages, emails, docs
    advice: str  # what to do about it, in the email
    money: bool = False
    symbols: tuple[str, ...] = ()
    # Called for every rule of this kind before any is measured, so that figures read for
    # several rules are read together (alerts.figures.scope_plan).
    plan: Callable[[RuleConfig, Window], None] | None = None
    # The scope kinds this rule can measure (None: all of SCOPE_KINDS).
    scopes: tuple[str, ...] | None = None

    def breaches(self, value: Decimal, threshold: Decimal) -> bool:
        return value > threshold if self.above else value < threshold

    def window_of(self, rule: RuleConfig, now: dt.datetime) -> Window:
        return window_for(self.window, rule.window_hours, now)


RULE_KINDS: dict[str, RuleKind] = {}


def rule_kind_register(kind: RuleKind) -> RuleKind:
    RULE_KINDS[kind.name] = kind
    return kind


def floor_hour(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def window_for(layout: str, window_hours: int | None, now: dt.datetime) -> Window:
    """Whole hours end at the last full hour: its rollup is complete, and every evaluation
    within one hour sees the same figures. The month starts at local midnight of the 1st in
    the report time zone (the months of the API and the dashboard)."""
    if layout == WINDOW_NOW:
        return Window(now, now)
    end = floor_hour(now)
    if layout == WINDOW_MONTH:
        local = end.astimezone(figures.report_zone())
        first = dt.datetime.combine(local.date().replace(day=1), dt.time(), tzinfo=local.tzinfo)
        return Window(first.astimezone(dt.UTC), end)
    return Window(end - dt.timedelta(hours=window_hours or DEFAULT_WINDOW_HOURS), end)


# --- threshold checks ----------------------------------------------------------------------
def _hours_in_window(value: Decimal, window_hours: int | None) -> str | None:
    hours = window_hours or DEFAULT_WINDOW_HOURS
    if not 0 < value <= hours:
        return f"must be more than 0 and at most the window ({hours} h)"
    return None


def _share(value: Decimal, window_hours: int | None) -> str | None:
    if not 0 < value < 1:
        return "a share: more than 0 and less than 1 (0.25 = 25 %)"
    return None


def _utilization(value: Decimal, window_hours: int | None) -> str | None:
    if not 0 < value <= 1:
        return "a utilisation: more than 0 and at most 1 (0.4 = 40 %)"
    return None


def _minutes(value: Decimal, window_hours: int | None) -> str | None:
    # last_seen_at moves in 5-minute steps and the dashboard calls a GPU offline after 15.
    if not 10 <= value <= 43_200:
        return "minutes: at least 10 and at most 43200 (30 days)"
    return None


def _gpu_hours_any(value: Decimal, window_hours: int | None) -> str | None:
    # A workload holds up to every GPU it was given: 8 GPUs for 24 h are 192 GPU hours.
    if not 0 < value <= 1_000_000:
        return "GPU hours: more than 0 and at most 1000000"
    return None


def _money(value: Decimal, window_hours: int | None) -> str | None:
    if not value > 0:
        return "money: more than 0"
    return None


# --- the rules of docs/alerts.md -----------------------------------------------------------
def _gpu_hours(field: str) -> MeasureFn:
    def measure(rule: RuleConfig, window: Window, now: dt.datetime) -> list[Measurement]:
        return [
            Measurement(g.subject, g.label, quantized(getattr(g, field)))
            for g in figures.gpu_hours(window=window, scope=rule.scope)
        ]

    return measure


def _gpu_throttled_share(rule: RuleConfig, window: Window, now: dt.datetime) -> list[Measurement]:
    return [
        Measurement(g.subject, g.label, quantized(g.throttled_hours / g.observed_hours))
        for g in figures.gpu_hours(window=window, scope=rule.scope)
        if g.observed_hours > 0
    ]


def _gpu_offline_minutes(rule: RuleConfig, window: Window, now: dt.datetime) -> list[Measurement]:
    return [
        Measurement(g.subject, g.label, quantized(Decimal(g.silent_s) / 60), g.silent_since)
        for g in figures.gpus_in_service(now=now, scope=rule.scope)
    ]


def _workload_held_hours(rule: RuleConfig, window: Window, now: dt.datetime) -> list[Measurement]:
    return [
        Measurement(w.subject, w.label, quantized(w.held_hours))
        for w in figures.workloads_held(window=window, scope=rule.scope)
    ]


def _queue_waited_hours(rule: RuleConfig, window: Window, now: dt.datetime) -> list[Measurement]:
    return [
        Measurement(p.subject, p.label, quantized(p.waited_gpu_hours))
        for p in figures.partitions_waited(window=window, scope=rule.scope)
    ]


def _scope_plan(rule: RuleConfig, window: Window) -> None:
    figures.scope_plan(window=window, scope=rule.scope)


def _scope_figure(attribute: str) -> MeasureFn:
    def measure(rule: RuleConfig, window: Window, now: dt.datetime) -> list[Measurement]:
        found = figures.scope_figures(window=window, scope=rule.scope)
        if found is None:
            return []
        value = getattr(found, attribute)
        if value is None:
            return []
        return [Measurement(str(rule.scope), found.label, quantized(value))]

    return measure


rule_kind_register(
    RuleKind(
        name="gpu_held_hours",
        measure=_gpu_hours("held_hours"),
        unit=HOURS,
        window=WINDOW_HOURS,
        above=True,
        check=_hours_in_window,
        what="hours each GPU was held (a process or job on it) without computing",
        advice=(
            "Something holds the GPU and does not compute: a job starved for data, a stalled "
            "checkpoint or an idle notebook. Release it, or ask its owner to; a batch "
            "scheduler can end allocations that stay idle."
        ),
    )
)
rule_kind_register(
    RuleKind(
        name="gpu_parked_hours",
        measure=_gpu_hours("parked_hours"),
        unit=HOURS,
        window=WINDOW_HOURS,
        above=True,
        check=_hours_in_window,
        what="hours each GPU sat unused, held by nobody",
        advice=(
            "Nobody uses the GPU. Give it to a queue that waits, lend it to another pool, or "
            "stop paying for it (return a rented one)."
        ),
    )
)
rule_kind_register(
    RuleKind(
        name="gpu_offline_minutes",
        measure=_gpu_offline_minutes,
        unit=MINUTES,
        window=WINDOW_NOW,
        above=True,
        check=_minutes,
        what="minutes since each GPU in service last reported",
        advice=(
            "The GPU reports nothing: check that its node runs and reaches the server, that "
            "the agent runs, and whether the GPU fell off the bus (nvidia-smi)."
        ),
    )
)
rule_kind_register(
    RuleKind(
        name="gpu_throttled_share",
        measure=_gpu_throttled_share,
        unit=SHARE,
        window=WINDOW_HOURS,
        above=True,
        check=_share,
        what="share of each GPU's observed time with its clocks throttled",
        advice=(
            "The GPU slows itself down: look at its power cap, cooling and temperature on its "
            "page; a rack power budget below the board limit throttles every job on it."
        ),
    )
)
rule_kind_register(
    RuleKind(
        name="utilization_below",
        measure=_scope_figure("utilization"),
        plan=_scope_plan,
        unit=SHARE,
        window=WINDOW_HOURS,
        above=False,
        check=_utilization,
        what="utilisation of the scope (hours in the air / capacity hours)",
        advice=(
            "The GPUs of this scope spend most of their paid hours not computing: the pool's "
            "page shows which GPUs, and whether they were held, parked or offline."
        ),
    )
)
rule_kind_register(
    RuleKind(
        name="idle_cost_above",
        measure=_scope_figure("idle_cost"),
        plan=_scope_plan,
        unit=MONEY,
        window=WINDOW_HOURS,
        above=True,
        check=_money,
        what="idle cost of the scope (paid hours not in the air, idle energy)",
        advice=(
            "Money goes to GPUs that do not compute. The page lists the GPUs by idle cost; "
            "the held ones have an owner to ask, the parked ones can be lent or returned."
        ),
        money=True,
    )
)
rule_kind_register(
    RuleKind(
        name="budget_month",
        measure=_scope_figure("total_cost"),
        plan=_scope_plan,
        unit=MONEY,
        window=WINDOW_MONTH,
        above=True,
        check=_money,
        what="total cost of the scope this month so far",
        advice="The month's spend has passed its budget.",
        money=True,
    )
)
rule_kind_register(
    RuleKind(
        name="workload_held_hours",
        measure=_workload_held_hours,
        unit=HOURS,
        window=WINDOW_HOURS,
        above=True,
        check=_gpu_hours_any,
        what="GPU hours each workload held without computing (its GPU hours − air hours)",
        advice=(
            "A job or pod kept GPUs it did not compute on. If it waits for data or for a "
            "person, give the GPUs back while it waits: end an interactive session when you "
            "leave it, ask for fewer GPUs (Slurm: --gres=gpu:N) when only some are used, and "
            "end a job (scancel JOBID) once its work is done; a Kubernetes pod releases its "
            "GPUs when it is scaled down or deleted."
        ),
        symbols=("owner",),
    )
)
rule_kind_register(
    RuleKind(
        name="queue_waited_hours",
        measure=_queue_waited_hours,
        unit=HOURS,
        window=WINDOW_HOURS,
        above=True,
        check=_gpu_hours_any,
        what=(
            "GPU hours each Slurm partition's jobs waited for capacity (pending on Resources, "
            "Priority or ReqNodeNotAvail)"
        ),
        advice=(
            "Jobs queue for GPUs. The Queue page says how many of those hours waited while "
            "GPUs of the partition's pools sat held or parked: if many, get the held ones "
            "back before buying more; if few, the partition needs more GPUs."
        ),
        scopes=("fleet", "site", "pool"),
    )
)
