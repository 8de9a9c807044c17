"""The package list (everything else is in pyproject.toml): dit_sp's and pipelines' packages, and the top-level
configs/ and assets/ folders mapped into the installed package as dit_sp.configs and dit_sp.assets."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["dit_sp*", "pipelines*"]), "dit_sp.configs", "dit_sp.assets"])
