"""``python -m ct200_tools.testbed``."""

from ct200_tools.testbed.cli import main

main()
