"""What setuptools packages: repro's code, plus the notebooks as package data.

The notebook chain (`repro notebooks`) runs notebooks/*.ipynb. An editable install and a checkout read them where
they are; a wheel (`pip install .`, as into AMD's images) has no checkout beside it, so the notebooks go into it as
the data-only package repro.notebook_files (repro/notebook_files/*.ipynb once installed). pyproject.toml cannot map
a folder outside repro/ into the package next to `packages.find`; setuptools' package_dir here does it.
Everything else (metadata, dependencies, package data globs) is in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

setup(packages=find_namespace_packages(include=["repro", "repro.*"]) + ["repro.notebook_files"],
      package_dir={"repro.notebook_files": "notebooks"})
