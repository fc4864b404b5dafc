"""``shmlocks unlink NAME``: remove a segment's name."""

from __future__ import annotations

import argparse
import os

from shmlocks._table import emit
from shmlocks.cli._common import (
    EXIT_OK,
    SHM_DIR,
    CliError,
    require_region,
    segment_name,
)


def cmd_unlink(args: argparse.Namespace) -> int:
    import posix_ipc  # type: ignore[import-not-found, unused-ignore]

    name = segment_name(args.name)
    if not args.force:
        require_region(name)
    elif not os.path.lexists(SHM_DIR / name):
        raise CliError(f"no shared-memory segment named {name!r}")
    try:
        posix_ipc.unlink_shared_memory("/" + name)
    except posix_ipc.ExistentialError as e:
        raise CliError(f"no shared-memory segment named {name!r}") from e
    except posix_ipc.PermissionsError as e:
        raise CliError(f"{name!r}: permission denied") from e
    emit(
        {"unlinked": name},
        args.json,
        lambda _: f"unlinked {name} (processes that have it mapped keep working)",
    )
    return EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="segment name (a leading / is optional)")
    p.add_argument(
        "--force", action="store_true", help="unlink even if it is not a shmlocks segment"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_unlink)
