"""``dlpack cache ls|du|clear``: the click commands over ``cachectl``."""
from __future__ import annotations

import click

from dlpack_io.tools.cli_common import echo_json, fail

_CACHE_DIR = click.option(
    "--cache-dir", type=click.Path(file_okay=False), default=None,
    help="The cache folder (default: $DLPACK_CACHE_DIR, else $XDG_CACHE_HOME/dlpack, else "
         "~/.cache/dlpack), as Dataset(..., cache_dir=) uses it.")


def _dir(cache_dir):
    from dlpack_io.reader.remote.cache import default_cache_dir

    return cache_dir or default_cache_dir()


@click.group()
def cache():
    """Show and free what remote data sets keep in the cache folder.

    \b
    dlpack cache ls      each cached data set: key, bytes, kept records, shards, in use, URL
    dlpack cache du      bytes per cached data set and in all
    dlpack cache clear   remove cached data sets no running process has open
    """


@cache.command("ls")
@_CACHE_DIR
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
def ls(cache_dir, as_json):
    """List the data sets cached in the cache folder."""
    from dataclasses import asdict

    from dlpack_io.tools.cachectl import entries

    found = entries(_dir(cache_dir))
    if as_json:
        echo_json([asdict(e) for e in found])
        return
    if not found:
        click.echo(f"no data sets cached in {_dir(cache_dir)}")
    for e in found:
        click.echo(f"{e.key}  {e.bytes:>15,} bytes  {e.records:>9,} records  {e.shards:>5,} "
                   f"shards  {'in use' if e.in_use else 'idle':6}  {e.url}")


@cache.command("du")
@_CACHE_DIR
def du(cache_dir):
    """Bytes each cached data set takes, and the total."""
    from dlpack_io.tools.cachectl import entries

    found = entries(_dir(cache_dir))
    for e in found:
        click.echo(f"{e.bytes:>15,}  {e.key}  {e.url}")
    click.echo(f"{sum(e.bytes for e in found):>15,}  total in {_dir(cache_dir)}")


@cache.command("clear")
@_CACHE_DIR
@click.argument("keys", nargs=-1)
def clear(cache_dir, keys):
    """Remove cached data sets (KEYS as `dlpack cache ls` shows them; all when none is
    given). A data set that a running process has open is left alone, and said so; exit 1
    when a KEY given is not cached, or was left because it is in use."""
    from dlpack_io.tools.cachectl import clear as do_clear

    removed, busy, unknown = do_clear(_dir(cache_dir), keys or None)
    for e in removed:
        click.echo(f"removed {e.key}  {e.bytes:,} bytes  {e.url}")
    for e in busy:
        click.echo(f"left {e.key}: in use by a running process (close it, then clear again)")
    click.echo(f"freed {sum(e.bytes for e in removed):,} bytes in {_dir(cache_dir)}")
    if unknown:
        fail(f"not cached in {_dir(cache_dir)}: {', '.join(unknown)} (see 'dlpack cache ls')")
    if keys and busy:  # asked for by name and still there: a script must not think it gone
        fail(f"not removed, in use: {', '.join(e.key for e in busy)}")
