"""`python -m quorumlog` runs the `quorumlog` command."""

from quorumlog.cli.main import main

if __name__ == "__main__":
    main()
