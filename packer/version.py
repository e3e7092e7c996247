"""The one home of dlpack's version: pyproject.toml reads it (``[tool.setuptools.dynamic]``),
the manifest records it, ``dlpack --version`` prints it."""
__version__ = "0.2.0"
