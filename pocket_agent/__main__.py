"""``python -m pocket_agent`` runs the ``pocket-agent`` command line."""

from .cli import main

raise SystemExit(main())
