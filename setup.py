"""The package list, which setup.cfg's ``find:`` cannot say: the hpctrain packages plus the two
top-level folders kernels/ and data_tools/, their one home, installed as ``hpctrain.kernels`` and
``hpctrain.data_tools`` (``package_dir``). Never as top-level ``kernels`` / ``data_tools``: ``kernels``
is also a PyPI distribution's package, and two distributions owning one name break each other
(tests/unit/test_install_names.py). An editable install (make setup) maps the two names to the
folders with setuptools' editable finder; a wheel holds copies under hpctrain/. Everything else
is in setup.cfg."""
from setuptools import find_packages, setup

HOMES = {"hpctrain.kernels": "kernels", "hpctrain.data_tools": "data_tools"}

setup(packages=find_packages(include=["hpctrain", "hpctrain.*"]) + sorted(HOMES), package_dir=HOMES)
