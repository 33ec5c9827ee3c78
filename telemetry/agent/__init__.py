"""The gpufleet node agent: reads every GPU once a second (NVML with GPM, or an existing
dcgm-exporter) and ships interval summaries.

Imports nothing from Django or the rest of the project: a GPU node needs only the standard
library and ``nvidia-ml-py`` (and ``prometheus-client`` for ``--source dcgm``):
``pip install gpufleet[agent]``, or a copy of this package.
"""

# The project's only version string: pyproject.toml reads it from here (setuptools dynamic).
__version__ = "1.0.0"
