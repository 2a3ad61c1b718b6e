"""`python -m specdepth.experiments.cli`: the same as the `specdepth` command."""

import sys

from specdepth.experiments.cli.main import main

sys.exit(main())
