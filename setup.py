"""Lets Dataflow workers install this package from --setup_file; all metadata lives in pyproject.toml."""

import setuptools

setuptools.setup()
