"""The GPU model catalogue: nominal power per model, matched against NVML's device name.

Sources: NVIDIA product briefs / datasheets for maximum board power (H100 SXM5 700 W, H100 PCIe
350 W, H200 SXM 700 W, H200 NVL 600 W, A100 SXM4 400 W, A100 PCIe 300 W (80GB) / 250 W (40GB),
L40S 350 W, L4 72 W, RTX 4090 450 W, RTX 6000 Ada 300 W, A40 300 W, A10 150 W) and idle draw
from published ``nvidia-smi`` captures of open-source exporters (dcgm-exporter and
nvidia_gpu_exporter issues and READMEs): H100 SXM ~69 W, H200 ~77 W, A100
SXM ~50 W, A40 ~30 W truly idle, RTX 4090 ~20 W idle (63 W held). Idle figures of the rest are
NVIDIA's "idle power" from product briefs where given, else typical captures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class CatalogueEntry:
    key: str
    name: str
    pattern: str  # regex, matched case-insensitively against the NVML device name
    max_power_w: float
    idle_power_w: float
    memory_gib: int


# Order matters: the first match wins, so the more specific names come first.
CATALOGUE: tuple[CatalogueEntry, ...] = (
    CatalogueEntry("H200-NVL", "NVIDIA H200 NVL", r"H200\s*NVL", 600, 70, 141),
    CatalogueEntry("H200-SXM", "NVIDIA H200 SXM", r"H200", 700, 77, 141),
    CatalogueEntry("H100-PCIE", "NVIDIA H100 PCIe", r"H100.*PCIe", 350, 48, 80),
    CatalogueEntry("H100-NVL", "NVIDIA H100 NVL", r"H100\s*NVL", 400, 60, 94),
    CatalogueEntry("H100-SXM", "NVIDIA H100 SXM", r"H100", 700, 69, 80),
    CatalogueEntry("A100-PCIE-40GB", "NVIDIA A100 PCIe 40GB", r"A100.*PCIE.*40GB", 250, 35, 40),
    CatalogueEntry("A100-PCIE", "NVIDIA A100 PCIe 80GB", r"A100.*PCIE", 300, 40, 80),
    CatalogueEntry("A100-SXM", "NVIDIA A100 SXM", r"A100", 400, 50, 80),
    CatalogueEntry("L40S", "NVIDIA L40S", r"L40S", 350, 35, 48),
    CatalogueEntry("L40", "NVIDIA L40", r"L40\b", 300, 35, 48),
    CatalogueEntry("L4", "NVIDIA L4", r"\bL4\b", 72, 16, 24),
    CatalogueEntry("A40", "NVIDIA A40", r"\bA40\b", 300, 30, 48),
    CatalogueEntry("A10", "NVIDIA A10", r"\bA10\b", 150, 20, 24),
    CatalogueEntry("RTX-6000-ADA", "NVIDIA RTX 6000 Ada", r"RTX 6000 Ada", 300, 25, 48),
    CatalogueEntry("RTX-4090", "NVIDIA GeForce RTX 4090", r"RTX 4090", 450, 20, 24),
)


def catalogue_match(device_name: str) -> CatalogueEntry | None:
    """The catalogue entry for an NVML device name, or None for a model we do not know."""
    for entry in CATALOGUE:
        if re.search(entry.pattern, device_name, flags=re.IGNORECASE):
            return entry
    return None
