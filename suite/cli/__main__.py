"""``python -m gpubench.cli``: the same as the ``gpubench`` command."""

from gpubench.cli import main

main()
