"""The package list only; everything else is in pyproject.toml.

pyproject.toml cannot both discover packages and map tasks/ and configs/ (repository top level)
into the seed_tot namespace, so the discovered seed_tot subpackages and the two mapped ones are
listed here: a new subpackage ships without anyone editing a list.
"""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["seed_tot", "seed_tot.*"]) + ["seed_tot.tasks", "seed_tot.configs"])
