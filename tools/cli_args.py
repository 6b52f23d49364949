"""Argument types and the parser class every ``trainingcxl`` command shares.

A bad argument ends the command with exit status 2 and one line on stderr that names the
option and what is wrong, never a traceback or a usage dump (``--help`` has the usage):

- ``CliParser``: an ``argparse.ArgumentParser`` whose errors are that one line; its
  sub-parsers are of the same class.
- ``positive_int`` / ``non_negative_int`` / ``seed_int``: argparse ``type=`` functions
  (decimal or 0x-prefixed); a seed is any int in [0, 2**32).
- ``CliError``: raised by a command for a bad request found after parsing (a trace that
  does not fit, a file that is not a trace); ``tools/cli.py`` prints it as that one line.
- ``check_output_path``: a ``--json`` / ``--report`` destination is checked before a run
  starts, so a long run never ends unable to write its result.
- ``add_shard_options``: ``--workers`` / ``--ray-address`` of the campaigns that shard on Ray.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys


class CliError(Exception):
    """A bad request: printed as ``error: <message>``, exit status 2."""


class CliParser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def seed_int(text: str) -> int:
    value = _int(text)
    if not 0 <= value < 1 << 32:
        raise argparse.ArgumentTypeError(f"a seed is an integer in [0, 2**32), got {value}")
    return value


def check_output_path(option: str, path: str, *, folder: bool = False) -> None:
    """Raise CliError unless ``path`` can be written (its folder is made if missing)."""
    target = pathlib.Path(path)
    parent = target if folder else target.parent
    if not folder and target.is_dir():
        raise CliError(f"{option} {path}: is a folder, not a file")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"{option} {path}: cannot make {parent} ({e.strerror or e})") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CliError(f"{option} {path}: {parent} is not writable")


def add_shard_options(parser: argparse.ArgumentParser, units: str) -> None:
    """``--workers N`` / ``--ray-address ADDR`` of a campaign whose independent ``units`` can
    run on Ray (tools/shard.py); the merged result does not depend on either."""
    parser.add_argument("--workers", type=positive_int, default=1,
                        help=f"run the independent units ({units}) N at a time on a local Ray instance "
                             "(default 1: no Ray)")
    parser.add_argument("--ray-address", default=None, metavar="ADDR",
                        help="run the units on the Ray cluster at ADDR (e.g. 'auto' or host:6379) instead")
