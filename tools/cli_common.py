"""What every ``dlpack`` command shares: the error exit, JSON output, the DST argument."""
from __future__ import annotations

import json
import sys

import click


def fail(message: str, code: int = 1):
    """Print ``dlpack: error: MESSAGE`` to stderr and exit with ``code`` (1: the command
    failed; the usage errors are click's own, exit 2)."""
    click.echo(f"dlpack: error: {message}", err=True)
    sys.exit(code)


def echo_json(data) -> None:
    """Print ``data`` as indented, key-sorted JSON (what every ``--json`` option prints)."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


class DatasetArg(click.ParamType):
    """A data set folder that exists, or an s3://bucket/prefix URL (checked when opened)."""

    name = "DST"

    def convert(self, value, param, ctx):
        """The value itself; a local path must be an existing folder (click's usage error
        otherwise), a URL is left for the reader to open."""
        if isinstance(value, str) and value.startswith("s3://"):
            return value
        return click.Path(exists=True, file_okay=False).convert(value, param, ctx)


DATASET = DatasetArg()  # the DST argument of inspect and verify
