"""diag: where did the MFU go? (README.md)"""

# The one place the version is written: pyproject.toml reads it ([tool.setuptools.dynamic]),
# `diag --version` prints it and every JSON report carries it as `diag_version`.
__version__ = "0.1.0"
