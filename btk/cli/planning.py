"""``btk profiles``, ``btk plan``, ``btk estimate``, ``btk compare``."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser("profiles", help="the profile catalog as a table")
    parser.set_defaults(handler=_profiles)


def _profiles(args: argparse.Namespace) -> int:
    from btk.catalog import all_profiles

    for profile in all_profiles().values():
        print(f"{profile.name:<14} {profile.family:<6} {profile.parameter_count / 1e9:6.2f}B")
    return 0
