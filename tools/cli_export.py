"""``dlpack export SET OUT --to webdataset|parquet``: the click command over
``dlpack_io.tools.export.export``."""
from __future__ import annotations

import click

from dlpack_io.tools.cli_common import DATASET, echo_json, fail


@click.command()
@click.argument("dataset", type=DATASET)
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--to", "to", type=click.Choice(("webdataset", "parquet")), required=True,
              help="webdataset: tars of KEY.jpg/.png, KEY.cls and one member per field; "
                   "parquet: the Hugging Face datasets layout (image struct, ClassLabel "
                   "label, one column per field). See docs/formats.md.")
@click.option("--shard-size", default="256MB", show_default=True,
              help="Bytes per output file (e.g. 64MB, 1GiB), as convert cuts shards.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def export(dataset, out, to, shard_size, quiet, as_json):
    """Write the data set DATASET into the new or empty folder OUT as WebDataset tars or
    Parquet files, in its order: the stored image bytes as they are (raw-pixel records as
    lossless PNG), the label and every field. OUT/_export.json, written last, lists the
    files, class names and field types; `dlpack convert OUT DST` reads them back."""
    from dlpack_io.reader.format import FormatError
    from dlpack_io.tools.export import export as run

    try:
        result = run(dataset, out, to=to, shard_size=shard_size, progress=not quiet)
    except (ValueError, OSError, ImportError, FormatError) as exc:
        fail(str(exc))
    if as_json:
        echo_json(result)
    else:
        click.echo(f"exported {result['num_samples']} samples into {result['shards']} "
                   f"{to} file(s) in {result['out']} ({result['bytes'] / 1e6:.1f} MB) in "
                   f"{result['seconds']:.1f} s: {result['mb_per_s']:.1f} MB/s of images")
