"""The one compiled module: Kineto events decoded straight to columns (``gpuidle.sources.kineto_scan``).

Optional: where it cannot be built (no C compiler) the package installs all the same and decodes in Python.
"""

from setuptools import Extension, setup

SOURCES = ["src/gpuidle/sources/_kscan.c", "src/gpuidle/sources/kscan/json.c", "src/gpuidle/sources/kscan/table.c"]

setup(ext_modules=[Extension("gpuidle.sources._kscan", SOURCES, optional=True)])
