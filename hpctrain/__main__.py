"""`python -m hpctrain` → :func:`hpctrain.cli.main`."""
import sys

from hpctrain.cli import main

sys.exit(main())
