"""``dlpack verify DST``: the click command over ``verification.verify``; its exit status
is the report's (0 intact, 1 damaged, 3 not a data set, 4 object storage unreadable)."""
from __future__ import annotations

import json
import sys

import click

from dlpack_io.tools.cli_common import DATASET


@click.command()
@click.argument("dst", type=DATASET)
@click.option("--decode", is_flag=True, help="Also decode every image (slower, proves more).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--max-pixels", type=int, default=None,
              help="Records larger than this many pixels (height x width) are damage; default "
                   "89478485, the default of convert --max-pixels.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
def verify(dst, decode, quiet, max_pixels, as_json):
    """Check the manifest, every shard and every record checksum in DST (a folder or
    s3://, gs:// or az://bucket/prefix: each shard is streamed to a temporary file and
    checked the same way).

    Exit status 0 when intact, 1 when anything is damaged (each problem is named), 3 when
    DST is not a data set at all (no manifest.json), 4 when object storage could not be
    read (endpoint unreachable, credentials refused, bucket or container missing: nothing
    was found damaged, and what could not be read was not checked).
    """
    from dlpack_io.reader.format import DEFAULT_MAX_PIXELS
    from dlpack_io.tools.render import verify_text
    from dlpack_io.tools.verification import verify as run

    report = run(dst, decode=decode, progress=not quiet,
                 max_pixels=max_pixels or DEFAULT_MAX_PIXELS).to_dict()
    click.echo(json.dumps(report, indent=2) if as_json else verify_text(report))
    sys.exit(report["exit_code"])
