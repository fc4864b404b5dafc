"""``python -m shmlocks``: the command line (see shmlocks/cli.py)."""

from shmlocks.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
