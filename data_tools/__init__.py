"""Dataset tools: convert sources to hpctrain HDF5 shards, verify and inspect them.

``hpctrain-data convert --from {imagefolder,cifar,mnist,npz,digits} SRC --out DIR`` (also
``python -m hpctrain.data_tools``); see ``hpctrain-data --help``. Installed as ``hpctrain.data_tools``
(setup.py's ``package_dir``: this folder is its one home): a bare top-level ``data_tools`` could
collide with another distribution's package.
"""
__all__ = ["cifar", "idx", "imagefolder", "cli", "inspection", "sources", "writer"]
