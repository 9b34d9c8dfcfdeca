"""``python -m lmclab`` is the ``lmclab`` command."""

from lmclab.cli import main

main()
