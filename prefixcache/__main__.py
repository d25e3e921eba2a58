"""``python -m prefixcache`` hands over to the experiment CLI."""

from prefixcache.experiments.cli import main

raise SystemExit(main())
