"""The ``dlpack`` command: a thin click layer over importable functions.

One module per command (cli_convert, cli_inspect, cli_verify, cli_export, cli_bench,
cli_doctor, cli_cache; cli_common holds what they share); this one is the group, its options and
``--version``. Heavy imports (numpy, PIL, torch, the benchmark package) happen inside the
commands so ``--help`` is instant.
"""
from __future__ import annotations

import logging

import click

from dlpack_io.tools.cli_bench import bench
from dlpack_io.tools.cli_cache import cache
from dlpack_io.tools.cli_convert import convert
from dlpack_io.tools.cli_doctor import doctor
from dlpack_io.tools.cli_export import export
from dlpack_io.tools.cli_inspect import inspect
from dlpack_io.tools.cli_verify import verify


def _print_version(ctx, param, value):
    """--version: our version plus the image stack that is active (which PIL, which decoder)."""
    if not value or ctx.resilient_parsing:
        return
    from importlib import metadata, util

    from dlpack_io.packer.finalize import pil_flavour
    from dlpack_io.reader.jpegdecode import backend_name

    triton = metadata.version("triton") if util.find_spec("triton") else "not installed"
    click.echo(f"dlpack {metadata.version('dlpack-io')}\nPIL: {pil_flavour()}\n"
               f"JPEG decoding in the Loader: {backend_name()}\ntriton: {triton}")
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and the active image stack (PIL flavour, decoder), then exit.")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages (e.g. each skipped file).")
def main(verbose: bool):
    """Pack JPEG folders into shards and feed them to PyTorch fast.

    \b
    dlpack convert SRC DST     pack a folder of JPEGs (or tars, Parquet, TFRecord, RecordIO)
    dlpack export DST OUT      write a data set out as WebDataset tars or Parquet
    dlpack inspect DST         what is in a packed data set
    dlpack verify DST          prove every record is intact
    dlpack bench SRC           measure converters, loaders and S3 reading side by side
    dlpack doctor DST          how fast this machine feeds training from DST, and how
    dlpack cache ls|du|clear   what remote data sets keep in the cache folder
    """
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")


for _command in (convert, inspect, verify, export, bench, doctor, cache):
    main.add_command(_command)


if __name__ == "__main__":
    main()
