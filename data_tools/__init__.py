"""Dataset tools: convert sources to hpctrain HDF5 shards, verify and inspect them.

``python -m data_tools convert --from digits --out DIR``; see ``python -m data_tools --help``.
"""
__all__ = ["convert", "sources", "writer"]
