"""``python -m convoy.cli``: the same as the ``convoy`` command."""

from convoy.cli import main

raise SystemExit(main())
