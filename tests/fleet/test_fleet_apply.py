"""The fleet file: applied as written, idempotent, updates what changed, clear errors."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from billing.models import CostProfile
from fleet.models import FleetSettings, Gpu, Node, Pool, Site, Team

pytestmark = pytest.mark.django_db

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "fleet.example.toml"


def apply(path: Path, capsys) -> str:
    call_command("fleet_apply", str(path))
    return capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.smoke
def test_example_file_applies_and_second_apply_changes_nothing(capsys):
    first = apply(EXAMPLE, capsys)
    assert "2 sites created" in first and "2 cost_profiles created" in first
    fs = FleetSettings.load()
    assert (fs.currency, fs.report_time_zone, fs.target_utilization) == (
        "USD",
        "Europe/Berlin",
        0.6,
    )
    fra1 = Site.objects.get(name="fra1")
    assert (fra1.pue, fra1.price_per_kwh, fra1.grid_g_per_kwh) == (
        Decimal("1.4"),
        Decimal("0.21"),
        380,
    )
    assert Pool.objects.get(name="training").team == Team.objects.get(name="research")
    assert Node.objects.get(hostname="gpu-07").pool.name == "training"
    gpu = Gpu.objects.get(uuid="GPU-2f6e8a1c-0000-4000-8000-000000000007")
    assert gpu.in_service_at == dt.datetime(2025, 3, 1, tzinfo=dt.UTC)
    owned = CostProfile.objects.get(scope_kind="pool", scope_name="training")
    assert (owned.kind, owned.purchase_price, owned.opex_per_hour) == (
        "owned",
        Decimal("30000.00"),
        Decimal("0.10"),
    )
    assert apply(EXAMPLE, capsys) == f"applied {EXAMPLE}: no changes"
    assert fs.breakeven == {
        "tokens_per_s_per_gpu": 2000.0,
        "api_input_price_per_mtok": "0.20",
        "api_output_price_per_mtok": "0.80",
        "output_share": 0.25,
        "rental_rate_per_hour": "2.35",
    }
    assert Pool.objects.get(name="inference").breakeven == {
        "tokens_per_s_per_gpu": 3500.0,
        "api_price_per_mtok": "0.30",
    }
    assert Pool.objects.get(name="training").breakeven == {}


def test_changed_file_updates_only_what_changed_and_drops_removed_profiles(tmp_path, capsys):
    apply(EXAMPLE, capsys)
    text = EXAMPLE.read_text().replace('price_per_kwh = "0.21"', 'price_per_kwh = "0.25"')
    text = text.split('[[cost_profiles]]\nscope = "site:iad1"')[0]
    changed = tmp_path / "fleet.toml"
    changed.write_text(text)
    summary = apply(changed, capsys)
    assert "1 sites updated" in summary and "1 cost_profiles_removed updated" in summary
    assert Site.objects.get(name="fra1").price_per_kwh == Decimal("0.25")
    assert list(CostProfile.objects.values_list("scope_name", flat=True)) == ["training"]
    assert Site.objects.count() == 2  # nothing deleted


def test_naive_dates_are_in_the_report_time_zone(tmp_path, capsys):
    apply(EXAMPLE, capsys)
    text = EXAMPLE.read_text().replace(
        'in_service = "2025-03-01T00:00:00Z"', "in_service = 2025-07-01T00:00:00"
    )
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    apply(path, capsys)
    gpu = Gpu.objects.get()
    # Midnight in Berlin in July is 22:00 UTC the day before (CEST = UTC+2).
    assert gpu.in_service_at == dt.datetime(2025, 6, 30, 22, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("mutation", "message"),
    [
        (lambda t: t.replace('currency = "USD"', ""), "currency: required"),
        (
            lambda t: t.replace('price_per_kwh = "0.21"', "price_per_kwh = 0.21"),
            "sites[0].price_per_kwh",
        ),
        (
            lambda t: t.replace('pool = "training"', 'pool = "nope"', 1),
            "nodes[0].pool: no pool named 'nope'",
        ),
        (lambda t: t.replace('kind = "owned"', 'kind = "leased"'), "cost_profiles[0].kind"),
        (lambda t: t.replace("pue = 1.4", "pue = 0.9"), "sites[0].pue"),
        (
            lambda t: t.replace('scope = "pool:training"', 'scope = "rack:7"'),
            "cost_profiles[0].scope",
        ),
        (lambda t: t + '\n[[gpus]]\nuuid = "GPU-x"\n', "gpus[1].node: required"),
        (lambda t: t.replace("Europe/Berlin", "Mars/Olympus", 1), "report_time_zone: unknown"),
        (lambda t: t + "\nthis is = = not toml", "not valid TOML"),
        (
            lambda t: t.replace("tokens_per_s_per_gpu = 2000", "tokens_per_s = 2000"),
            "breakeven.tokens_per_s: unknown",
        ),
        (
            # Below the break-even form's minimum (0.001), which the page would refuse.
            lambda t: t.replace("tokens_per_s_per_gpu = 2000", "tokens_per_s_per_gpu = 0.0005"),
            "breakeven.tokens_per_s_per_gpu: Ensure this value is greater than or equal to 0.001",
        ),
        (
            lambda t: t.replace("output_share = 0.25", "output_share = 1.5"),
            "breakeven.output_share: Ensure this value is less than or equal to 1",
        ),
        (
            lambda t: t.replace('api_price_per_mtok = "0.30"', "api_price_per_mtok = 0.30"),
            "pools[1].breakeven.api_price_per_mtok: money must be a string",
        ),
        (
            lambda t: t.replace(
                'api_price_per_mtok = "0.30" }',
                'api_price_per_mtok = "0.30", output_share = 0.2, '
                'api_input_price_per_mtok = "0.1" }',
            ),
            "pools[1].breakeven: give either api_price_per_mtok",
        ),
        (lambda t: t.replace("tflops = 989", "tflops = 0"), "peaks[0].tflops: must be"),
        (lambda t: t.replace("tflops = 989", "tflops = -5.5"), "peaks[0].tflops: must be"),
        (lambda t: t.replace("tflops = 989", 'tflops = "989"'), "peaks[0].tflops: required"),
        (lambda t: t.replace("tflops = 989", "tflops = nan"), "peaks[0].tflops: must be"),
        (lambda t: t.replace("tflops = 2250", "teraflops = 2250"), "peaks[1].teraflops: unknown"),
        (lambda t: t.replace('model = "NVIDIA B200"', 'model = ""'), "peaks[1].model: required"),
        (
            # "H100 SXM" is the catalogue's H100-SXM, which the first row sets already
            lambda t: t.replace('model = "NVIDIA B200"', 'model = "H100 SXM"'),
            "peaks[1].model: 'H100 SXM' is H100-SXM, which an earlier row sets",
        ),
    ],
)
def test_bad_files_name_the_field_and_change_nothing(tmp_path, mutation, message):
    path = tmp_path / "fleet.toml"
    path.write_text(mutation(EXAMPLE.read_text()))
    with pytest.raises(CommandError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call_command("fleet_apply", str(path))
    assert Site.objects.count() == 0 and CostProfile.objects.count() == 0


def test_moving_a_gpu_to_another_node(tmp_path, capsys):
    apply(EXAMPLE, capsys)
    path = tmp_path / "fleet.toml"
    path.write_text(EXAMPLE.read_text().replace('node = "gpu-07"', 'node = "inf-01"'))
    assert "1 gpus updated" in apply(path, capsys)
    assert Gpu.objects.get().node.hostname == "inf-01"


def test_peaks_stored_by_catalogue_key_and_used_for_mfu(tmp_path, capsys):
    """``[[peaks]]``: a catalogue model by its key or any name the catalogue reads as it
    (stored under the key), an unknown model by its name as written; MFU divides by them."""
    from telemetry.efficiency import fleet_peaks, peak_flops

    apply(EXAMPLE, capsys)
    assert FleetSettings.load().peaks == {"H100-SXM": 989.0, "NVIDIA B200": 2250.0}
    text = (
        EXAMPLE.read_text()
        .replace('model = "H100-SXM"', 'model = "h100 pcie"')
        .replace("tflops = 989", "tflops = 700.5")
    )
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    assert "1 settings updated" in apply(path, capsys)
    assert FleetSettings.load().peaks == {"H100-PCIE": 700.5, "NVIDIA B200": 2250.0}
    peaks = fleet_peaks()
    assert peak_flops("NVIDIA H100 PCIe", peaks) == 700.5e12
    assert peak_flops("NVIDIA B200", peaks) == 2250e12
    assert peak_flops("NVIDIA H100 80GB HBM3", peaks) == 989e12  # the built-in table
    # A file without [[peaks]] leaves the built-in table alone.
    path.write_text(text.split("[[peaks]]")[0] + "[[gpus]]" + text.split("[[gpus]]", 1)[1])
    apply(path, capsys)
    assert FleetSettings.load().peaks == {}
