"""Forms of the dashboard: the filter bar and the break-even calculator (both GET, so every
view is a URL that can be bookmarked and shared)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django import forms

from billing import breakeven as be
from billing.selectors import breakeven_workload_measured
from fleet.bounds import date_validator
from fleet.models import GpuModel, Pool, Site, Team

# A fleet file's break-even workload (`[breakeven]`, `pools[].breakeven`): each key and the
# field of BreakevenForm that it fills, and whose bounds it must meet (billing.services).
BREAKEVEN_KEYS = {
    "tokens_per_s_per_gpu": "tokens_per_s",
    "api_input_price_per_mtok": "api_input_price_per_mtok",
    "api_output_price_per_mtok": "api_output_price_per_mtok",
    "output_share": "output_share",
    "api_price_per_mtok": "api_price_per_mtok",  # blended: instead of the two prices
    "rental_rate_per_hour": "rental_rate_per_hour",
}
PRICE_KEYS = be.PRICE_KEYS
# The pool choice that means the whole fleet: every GPU that is not rented, as one pool.
FLEET_CHOICE = ("", "Whole fleet (owned GPUs)")
# The filter bar's period shortcuts (``?period=``), days of the report time zone
# (billing.dashboard.preset_range). A link keeps its meaning: "last week" is last week
# whenever it is opened.
PRESETS = {
    "last_30_days": "Last 30 days",
    "this_week": "This week",
    "last_week": "Last week",
    "month_to_date": "Month to date",
    "last_month": "Last month",
    "last_quarter": "Last quarter",
}


class FilterForm(forms.Form):
    """``?from=&to=&site=&pool=&team=&model=`` or ``?period=`` instead of the two days; each
    filter repeatable, names not ids, so a URL survives a re-import of the fleet file."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        date_widget = forms.DateInput(attrs={"type": "date"})
        # "from" is a Python keyword, hence fields added here rather than declared.
        bounded = [date_validator]  # billing.periods: no overflow at the calendar's ends
        self.fields["from"] = forms.DateField(
            required=False, label="From", widget=date_widget, validators=bounded
        )
        self.fields["to"] = forms.DateField(
            required=False, label="To", widget=date_widget, validators=bounded
        )
        self.fields["period"] = forms.ChoiceField(
            required=False, label="Period", choices=[("", "")] + list(PRESETS.items())
        )
        self.fields["site"] = forms.MultipleChoiceField(
            required=False, choices=[(s, s) for s in Site.objects.values_list("name", flat=True)]
        )
        self.fields["pool"] = forms.MultipleChoiceField(
            required=False, choices=[(p, p) for p in Pool.objects.values_list("name", flat=True)]
        )
        self.fields["team"] = forms.MultipleChoiceField(
            required=False, choices=[(t, t) for t in Team.objects.values_list("name", flat=True)]
        )
        self.fields["model"] = forms.MultipleChoiceField(
            required=False,
            choices=list(
                GpuModel.objects.filter(gpu__isnull=False).distinct().values_list("key", "name")
            ),
        )

    def options(self) -> list[dict[str, Any]]:
        """The four selects of the filter bar, with what is selected now."""
        data = getattr(self, "cleaned_data", {}) or {}
        out = []
        for key, label in (
            ("site", "Site"),
            ("pool", "Pool"),
            ("team", "Team"),
            ("model", "GPU model"),
        ):
            selected = set(data.get(key) or ())
            field = self.fields[key]
            assert isinstance(field, forms.ChoiceField)
            out.append(
                {
                    "key": key,
                    "label": label,
                    "choices": [
                        {"value": v, "label": lab, "selected": v in selected}
                        for v, lab in list(field.choices)  # type: ignore[arg-type]
                    ],
                }
            )
        return out


class BreakevenForm(forms.Form):
    """The break-even's workload profile (docs/metrics.md): a pool (or the whole fleet), its
    throughput and an API price, blended or as input and output prices with the output share
    of tokens. The initial values are the product's defaults (``billing.breakeven``)."""

    pool = forms.ChoiceField(required=False, initial="")
    tokens_per_s = forms.FloatField(
        label="Tokens/s per GPU",
        min_value=0.001,
        max_value=be.TOKENS_PER_S_MAX,
        initial=be.PRODUCT_WORKLOAD["tokens_per_s_per_gpu"],
        help_text="At full load, for your model on this GPU",
    )
    price_mode = forms.ChoiceField(
        choices=[("split", "Input and output prices"), ("blended", "Blended price")],
        initial="split",
        required=False,
    )
    api_price_per_mtok = forms.DecimalField(
        label="API price / M tokens (blended)",
        min_value=Decimal("0"),
        required=False,
        max_digits=12,
        decimal_places=6,
    )
    api_input_price_per_mtok = forms.DecimalField(
        label="API input price / M tokens",
        min_value=Decimal("0"),
        required=False,
        initial=be.PRODUCT_WORKLOAD["api_input_price_per_mtok"],
        max_digits=12,
        decimal_places=6,
    )
    api_output_price_per_mtok = forms.DecimalField(
        label="API output price / M tokens",
        min_value=Decimal("0"),
        required=False,
        initial=be.PRODUCT_WORKLOAD["api_output_price_per_mtok"],
        max_digits=12,
        decimal_places=6,
    )
    output_share = forms.FloatField(
        label="Output share of tokens",
        min_value=0,
        max_value=1,
        initial=be.PRODUCT_WORKLOAD["output_share"],
        required=False,
    )
    rental_rate_per_hour = forms.DecimalField(
        label="On-demand rental / GPU-hour",
        min_value=Decimal("0"),
        required=False,
        initial=be.PRODUCT_WORKLOAD["rental_rate_per_hour"],
        max_digits=12,
        decimal_places=6,
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pools = list(Pool.objects.values_list("name", flat=True))
        choices = [FLEET_CHOICE] + [(p, p) for p in pools]
        self.fields["pool"].choices = choices  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        mode = data.get("price_mode") or "split"
        if mode == "blended":
            if data.get("api_price_per_mtok") is None:
                self.add_error("api_price_per_mtok", "Give the blended API price.")
        else:
            for name in ("api_input_price_per_mtok", "api_output_price_per_mtok", "output_share"):
                if data.get(name) is None:
                    self.add_error(name, "Required with input and output prices.")
        data["price_mode"] = mode
        return data

    @classmethod
    def initial_query(cls, pool: str | None, *, start: dt.date, end: dt.date) -> dict[str, Any]:
        """The defaults as submitted data, so the page shows a result on first load: the
        whole fleet (no ``pool``) or the pool, at the workload in force for it over the days
        ``[start, end)`` (its own from the fleet file, else the fleet's, else the product's,
        its tokens per second those its jobs measured where they reported:
        ``breakeven_workload_measured``)."""
        form = cls()
        data = {
            name: field.initial for name, field in form.fields.items() if field.initial is not None
        }
        data["pool"] = pool or ""
        workload, _ = breakeven_workload_measured(pool=pool, start=start, end=end)
        if "api_price_per_mtok" in workload:
            data["price_mode"] = "blended"
        for key, value in workload.items():
            data[BREAKEVEN_KEYS[key]] = value
        return data
