# ruff: noqa: E501 - exposition lines are as long as the exporter writes them
"""dcgm-exporter answers, written by hand in its documented format (NVIDIA's
default-counters.csv and dcp-metrics-included.csv; published captures): ``# HELP``/``# TYPE``
per field, series labelled ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``,
``Hostname``, ``DCGM_FI_DRIVER_VERSION``, and with the Kubernetes pod mapper ``container``,
``namespace``, ``pod`` (and an empty ``pod_uid``).

Each fixture is a ``string.Template`` whose ``$names`` a test fills per second, so the same
exposition can say what a GPU did in every second of an interval.
"""

from __future__ import annotations

from string import Template

H100_UUID = "GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11"
H100_IDLE_UUID = "GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d"

# Two H100 SXM on a host whose exporter runs the profiling (DCP) counters: as such setups
# often do, it exports DCGM_FI_PROF_GR_ENGINE_ACTIVE and no DCGM_FI_DEV_GPU_UTIL. GPU 1 idles.
H100_PROFILING = Template(
    """\
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $clock
DCGM_FI_DEV_SM_CLOCK{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 345
# HELP DCGM_FI_DEV_MEM_CLOCK Memory clock frequency (in MHz).
# TYPE DCGM_FI_DEV_MEM_CLOCK gauge
DCGM_FI_DEV_MEM_CLOCK{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 2619
DCGM_FI_DEV_MEM_CLOCK{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 2619
# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).
# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge
DCGM_FI_DEV_MEMORY_TEMP{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 58
DCGM_FI_DEV_MEMORY_TEMP{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 33
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $temp
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 31
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $power
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 69.012000
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $energy
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $energy_idle
# HELP DCGM_FI_DEV_PCIE_REPLAY_COUNTER Total number of PCIe retries.
# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0
DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0
# HELP DCGM_FI_DEV_MEM_COPY_UTIL Memory utilization (in %).
# TYPE DCGM_FI_DEV_MEM_COPY_UTIL gauge
DCGM_FI_DEV_MEM_COPY_UTIL{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $mem_util
DCGM_FI_DEV_MEM_COPY_UTIL{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0
DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 20000
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 81000
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 61000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0
# HELP DCGM_FI_DEV_FB_RESERVED Framebuffer memory reserved (in MiB).
# TYPE DCGM_FI_DEV_FB_RESERVED gauge
DCGM_FI_DEV_FB_RESERVED{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 559
DCGM_FI_DEV_FB_RESERVED{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 559
# HELP DCGM_FI_DEV_CLOCKS_EVENT_REASONS Current clock event reasons (bitmask).
# TYPE DCGM_FI_DEV_CLOCKS_EVENT_REASONS gauge
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $reasons
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 1
# HELP DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL Total number of NVLink bandwidth counters for all lanes.
# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 1438129
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $gr_active
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0.000000
# HELP DCGM_FI_PROF_SM_ACTIVE The ratio of cycles an SM has at least 1 warp assigned.
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $sm_active
DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0.000000
# HELP DCGM_FI_PROF_SM_OCCUPANCY The ratio of number of warps resident on an SM.
# TYPE DCGM_FI_PROF_SM_OCCUPANCY gauge
DCGM_FI_PROF_SM_OCCUPANCY{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $sm_occupancy
DCGM_FI_PROF_SM_OCCUPANCY{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0.000000
# HELP DCGM_FI_PROF_PIPE_TENSOR_ACTIVE Ratio of cycles the tensor (HMMA) pipe is active.
# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $tensor_active
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0.000000
# HELP DCGM_FI_PROF_DRAM_ACTIVE Ratio of cycles the device memory interface is active sending or receiving data.
# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge
DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} $dram_active
DCGM_FI_PROF_DRAM_ACTIVE{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 0.000000
# HELP DCGM_FI_PROF_PCIE_TX_BYTES The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.
# TYPE DCGM_FI_PROF_PCIE_TX_BYTES gauge
DCGM_FI_PROF_PCIE_TX_BYTES{gpu="0",UUID="GPU-2f6e3b1c-9d4a-4c57-8e21-7a0b5c9d3e11",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 31415926
DCGM_FI_PROF_PCIE_TX_BYTES{gpu="1",UUID="GPU-8c1d7e42-3b9f-4a06-b5d8-1e2f3a4b5c6d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-07",DCGM_FI_DRIVER_VERSION="560.35.03"} 1024
"""
)

A100_UUID = "GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"

# One A100 SXM4 80GB under an older exporter with the default counters: DCGM_FI_DEV_GPU_UTIL,
# no profiling fields, no FB_RESERVED (total = used + free), the throttle reasons under their
# pre-3.3 name, and the "not supported" blank (DCGM_INT64_BLANK + 2) on the memory temperature.
A100_DEFAULT = Template(
    """\
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} $clock
# HELP DCGM_FI_DEV_MEM_CLOCK Memory clock frequency (in MHz).
# TYPE DCGM_FI_DEV_MEM_CLOCK gauge
DCGM_FI_DEV_MEM_CLOCK{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} 1593
# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).
# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge
DCGM_FI_DEV_MEMORY_TEMP{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} 9223372036854775794
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} $temp
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} $power
# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).
# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} $energy
# HELP DCGM_FI_DEV_PCIE_TX_THROUGHPUT Total number of bytes transmitted through PCIe TX (in KB) via NVML.
# TYPE DCGM_FI_DEV_PCIE_TX_THROUGHPUT counter
DCGM_FI_DEV_PCIE_TX_THROUGHPUT{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} 2781245
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} $util
# HELP DCGM_FI_DEV_MEM_COPY_UTIL Memory utilization (in %).
# TYPE DCGM_FI_DEV_MEM_COPY_UTIL gauge
DCGM_FI_DEV_MEM_COPY_UTIL{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} $mem_util
# HELP DCGM_FI_DEV_ENC_UTIL Encoder utilization (in %).
# TYPE DCGM_FI_DEV_ENC_UTIL gauge
DCGM_FI_DEV_ENC_UTIL{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} 0
# HELP DCGM_FI_DEV_DEC_UTIL Decoder utilization (in %).
# TYPE DCGM_FI_DEV_DEC_UTIL gauge
DCGM_FI_DEV_DEC_UTIL{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} 0
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} 0
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} 11920
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} 70000
# HELP DCGM_FI_DEV_CLOCK_THROTTLE_REASONS Current clock throttle reasons.
# TYPE DCGM_FI_DEV_CLOCK_THROTTLE_REASONS gauge
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} $reasons
# HELP DCGM_FI_DEV_VGPU_LICENSE_STATUS vGPU License status
# TYPE DCGM_FI_DEV_VGPU_LICENSE_STATUS gauge
DCGM_FI_DEV_VGPU_LICENSE_STATUS{gpu="0",UUID="GPU-5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="dgx-a100-03"} 0
"""
)

L4_UUIDS = (
    "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
    "GPU-1b2c3d4e-5f6a-4b7c-9d8e-0f1a2b3c4d5e",
    "GPU-2c3d4e5f-6a7b-4c8d-ae9f-1a2b3c4d5e6f",
)

# Three L4 on a Kubernetes node, dcgm-exporter from the GPU Operator with its pod mapper: GPU 0
# belongs to pod research/train-llm-0; GPU 1 to no pod (empty labels); GPU 2 is time-sliced
# between two replicas of inference/vllm, so each of its series appears once per pod.
K8S_L4 = Template(
    """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",pci_bus_id="00000000:38:00.0",device="nvidia0",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="trainer",namespace="research",pod="train-llm-0",pod_uid=""} $util0
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1b2c3d4e-5f6a-4b7c-9d8e-0f1a2b3c4d5e",pci_bus_id="00000000:3A:00.0",device="nvidia1",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="",namespace="",pod="",pod_uid=""} 0
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-2c3d4e5f-6a7b-4c8d-ae9f-1a2b3c4d5e6f",pci_bus_id="00000000:3C:00.0",device="nvidia2",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="vllm",namespace="inference",pod="vllm-7d9f8b6c5-k2x4p",pod_uid=""} $util2
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-2c3d4e5f-6a7b-4c8d-ae9f-1a2b3c4d5e6f",pci_bus_id="00000000:3C:00.0",device="nvidia2",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="vllm",namespace="inference",pod="vllm-7d9f8b6c5-q8w2z",pod_uid=""} $util2
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",pci_bus_id="00000000:38:00.0",device="nvidia0",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="trainer",namespace="research",pod="train-llm-0",pod_uid=""} 61.5
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-1b2c3d4e-5f6a-4b7c-9d8e-0f1a2b3c4d5e",pci_bus_id="00000000:3A:00.0",device="nvidia1",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="",namespace="",pod="",pod_uid=""} 16.25
DCGM_FI_DEV_POWER_USAGE{gpu="2",UUID="GPU-2c3d4e5f-6a7b-4c8d-ae9f-1a2b3c4d5e6f",pci_bus_id="00000000:3C:00.0",device="nvidia2",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="vllm",namespace="inference",pod="vllm-7d9f8b6c5-k2x4p",pod_uid=""} 40
DCGM_FI_DEV_POWER_USAGE{gpu="2",UUID="GPU-2c3d4e5f-6a7b-4c8d-ae9f-1a2b3c4d5e6f",pci_bus_id="00000000:3C:00.0",device="nvidia2",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="vllm",namespace="inference",pod="vllm-7d9f8b6c5-q8w2z",pod_uid=""} 40
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",pci_bus_id="00000000:38:00.0",device="nvidia0",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="trainer",namespace="research",pod="train-llm-0",pod_uid=""} 1034
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-1b2c3d4e-5f6a-4b7c-9d8e-0f1a2b3c4d5e",pci_bus_id="00000000:3A:00.0",device="nvidia1",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="",namespace="",pod="",pod_uid=""} 22034
DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-2c3d4e5f-6a7b-4c8d-ae9f-1a2b3c4d5e6f",pci_bus_id="00000000:3C:00.0",device="nvidia2",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="vllm",namespace="inference",pod="vllm-7d9f8b6c5-k2x4p",pod_uid=""} 6034
DCGM_FI_DEV_FB_FREE{gpu="2",UUID="GPU-2c3d4e5f-6a7b-4c8d-ae9f-1a2b3c4d5e6f",pci_bus_id="00000000:3C:00.0",device="nvidia2",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="vllm",namespace="inference",pod="vllm-7d9f8b6c5-q8w2z",pod_uid=""} 6034
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",pci_bus_id="00000000:38:00.0",device="nvidia0",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="trainer",namespace="research",pod="train-llm-0",pod_uid=""} 21000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-1b2c3d4e-5f6a-4b7c-9d8e-0f1a2b3c4d5e",pci_bus_id="00000000:3A:00.0",device="nvidia1",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="",namespace="",pod="",pod_uid=""} 0
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-2c3d4e5f-6a7b-4c8d-ae9f-1a2b3c4d5e6f",pci_bus_id="00000000:3C:00.0",device="nvidia2",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="vllm",namespace="inference",pod="vllm-7d9f8b6c5-k2x4p",pod_uid=""} 16000
DCGM_FI_DEV_FB_USED{gpu="2",UUID="GPU-2c3d4e5f-6a7b-4c8d-ae9f-1a2b3c4d5e6f",pci_bus_id="00000000:3C:00.0",device="nvidia2",modelName="NVIDIA L4",Hostname="ip-10-0-12-34.ec2.internal",DCGM_FI_DRIVER_VERSION="550.90.07",container="vllm",namespace="inference",pod="vllm-7d9f8b6c5-q8w2z",pod_uid=""} 16000
"""
)
