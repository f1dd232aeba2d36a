"""``python -m hpctrain.data_tools``: the dataset tools' command line (:mod:`hpctrain.data_tools.cli`).

From a checkout's root the old spelling ``python -m data_tools`` runs this file too; the absolute
import makes it use the installed names, so a plugin source registers where the CLI looks it up.
"""
import sys

from hpctrain.data_tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
