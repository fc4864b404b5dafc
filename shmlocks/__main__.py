"""``python -m shmlocks``: the command line (see shmlocks/cli/__init__.py)."""

import sys

import shmlocks

if getattr(shmlocks, "__file__", None) is None:
    # `shmlocks` is a namespace package: a folder named shmlocks without __init__.py (a
    # clone of the repository, say) in the current directory, which `python -m` puts first
    # on sys.path, was found before the installed package (an editable install is found
    # last, by its own finder). Every `from shmlocks import ...` would fail.
    where = ", ".join(getattr(shmlocks, "__path__", [])) or "?"
    sys.exit(
        f"shmlocks: error: 'shmlocks' here is the folder {where}, not the package: "
        "`python -m` puts the current directory first on sys.path, and a folder of that "
        "name there shadows the installed shmlocks. Run it from another directory (or "
        "from inside the clone), or use the `shmlocks` command."
    )

from shmlocks.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
