from django.contrib import admin

from billing.models import CostProfile


@admin.register(CostProfile)
class CostProfileAdmin(admin.ModelAdmin[CostProfile]):
    list_display = [
        "scope_kind",
        "scope_name",
        "kind",
        "purchase_price",
        "depreciation_years",
        "opex_per_hour",
        "rental_rate_per_hour",
    ]
    list_filter = ["scope_kind", "kind"]
