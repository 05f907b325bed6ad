"""``python -m convoy``: the same as the ``convoy`` command."""

from convoy.cli import main

raise SystemExit(main())
