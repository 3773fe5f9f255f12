"""`python -m capacity.cli ...`: the `capacity` command, where the entry point is not on PATH."""
from capacity.cli import main

main()
