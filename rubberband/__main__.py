"""``python -m rubberband`` runs the CLI."""

from rubberband.cli import main

main()
