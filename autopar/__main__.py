"""`python -m autopar`: the same command line as `autopar`."""
from autopar.cli import main

main()
