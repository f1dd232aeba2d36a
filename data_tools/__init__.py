"""Dataset tools: convert sources to hpctrain HDF5 shards, verify and inspect them.

``hpctrain-data convert --from {imagefolder,cifar,mnist,npz,digits} SRC --out DIR`` (also
``python -m hpctrain.data_tools``); see ``hpctrain-data --help``. Installed as ``hpctrain.data_tools``
(``hpctrain/data_tools`` links to this folder): a bare top-level ``data_tools`` could collide with
another distribution's package.
"""
if __name__ == "data_tools":   # the bare name, from a checkout: the installed package's modules
    from hpctrain.bare_names import become
    become(__name__, "hpctrain.data_tools")

__all__ = ["cifar", "idx", "imagefolder", "cli", "inspection", "sources", "writer"]
