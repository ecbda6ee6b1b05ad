"""``python -m polyport.gateway.cli``: the ``polyport`` command."""

from polyport.gateway.cli.main import main

raise SystemExit(main())
