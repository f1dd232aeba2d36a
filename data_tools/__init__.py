"""Dataset tools: convert sources to hpctrain HDF5 shards, verify and inspect them.

``python -m data_tools convert --from {imagefolder,cifar,mnist,npz,digits} SRC --out DIR``;
see ``python -m data_tools --help``.
"""
__all__ = ["cifar", "idx", "imagefolder", "inspection", "sources", "writer"]
