"""`python -m installer` entry point."""

from installer.cli import main

main()
