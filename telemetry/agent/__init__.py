"""The gpufleet node agent: samples NVML once a second and ships interval summaries.

Imports nothing from Django or the rest of the project: a GPU node needs only the standard
library and ``nvidia-ml-py`` (``pip install gpufleet[agent]``, or a copy of this package).
"""

# The project's only version string: pyproject.toml reads it from here (setuptools dynamic).
__version__ = "1.0.0"
