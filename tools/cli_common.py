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
    """A data set folder that exists, or an s3://, gs:// or az:// URL (checked when opened);
    a URL of another scheme is a usage error naming the supported ones."""

    name = "DST"

    def convert(self, value, param, ctx):
        """The value itself; a local path must be an existing folder (click's usage error
        otherwise), a URL is left for the reader to open."""
        from dlpack_io.reader.remote.clouds import is_remote

        try:
            if is_remote(value):
                return value
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return click.Path(exists=True, file_okay=False).convert(value, param, ctx)


DATASET = DatasetArg()  # the DST argument of inspect and verify


class LazyChoice(click.Choice):
    """A ``click.Choice`` whose values are read from their one home in the library when
    first needed (parsing, or a command's ``--help``): ``LazyChoice("dlpack_io.packer.options",
    "NON_JPEG")``. Importing the CLI thus stays free of numpy and torch, and no option list
    is a copy that could drift from what the library accepts."""

    def __init__(self, module: str, name: str, extra=(), **kwargs):
        self._where, self._extra = (module, name), tuple(extra)
        super().__init__((), **kwargs)

    @property
    def choices(self):
        import importlib

        module, name = self._where
        return tuple(getattr(importlib.import_module(module), name)) + self._extra

    @choices.setter
    def choices(self, value):
        pass  # click.Choice.__init__ assigns them; ours are read from the library

