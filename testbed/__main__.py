"""``python -m testbed``."""

from testbed.cli import main

main()
