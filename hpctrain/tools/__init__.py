"""Tools beside the library, not part of it: ``bench`` (benchmarks and the large-batch study),
``sim`` (the α-β cost model, ``python -m hpctrain simulate``), ``cluster`` (the emulated multi-node
network). The core never imports this package; only :mod:`hpctrain.cli` reaches it, lazily, to run
a subcommand."""
