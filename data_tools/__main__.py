"""``python -m hpctrain.data_tools``: the dataset tools' command line (:mod:`hpctrain.data_tools.cli`)."""
import sys

from hpctrain.data_tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
