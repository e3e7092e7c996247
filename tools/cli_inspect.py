"""``dlpack inspect DST``: the click command over the functions of ``inspection`` and
``order_report`` (they return data; this prints it, as text or JSON)."""
from __future__ import annotations

import click

from dlpack_io.tools.cli_common import DATASET, echo_json, fail


@click.command()
@click.argument("dst", type=DATASET)
@click.option("--shard", type=int, help="Show shard number K and its first records.")
@click.option("--index", "sample", type=int, help="Show everything about sample I (negative: "
              "counted from the end, -1 is the last).")
@click.option("--grid", type=click.Path(dir_okay=False),
              help="Write a contact sheet of sample images with their labels to FILE (.png "
                   "is added when FILE has no extension).")
@click.option("--augmented", is_flag=True,
              help="With --grid: draw what a Loader yields after RandomResizedCrop(224) and "
                   "RandomHorizontalFlip() (boxes and masks as it yields them), to see that "
                   "they still sit on their objects.")
@click.option("--grid-count", type=int, default=48, show_default=True, help="Images on the sheet.")
@click.option("--order", is_flag=True, help="Show what a rank's epoch reads and how well its "
              "batches mix shards and classes (global vs block shuffle vs none).")
@click.option("--shuffle", type=click.Choice(["global", "block", "none"]), default="global",
              show_default=True, help="With --order: the Loader's shuffle mode.")
@click.option("--epoch", type=int, default=0, show_default=True, help="With --order: the epoch.")
@click.option("--world-size", type=int, default=1, show_default=True,
              help="With --order: number of ranks.")
@click.option("--rank", type=int, default=0, show_default=True, help="With --order: this rank.")
@click.option("--batch-size", type=int, default=256, show_default=True,
              help="With --order: the Loader's batch size.")
@click.option("--drop-last/--no-drop-last", default=False, show_default=True,
              help="With --order: the Loader's drop_last (its default is --no-drop-last).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed for picking sheet images, or the Loader's seed with --order.")
@click.option("--max-pixels", type=int, default=None,
              help="Refuse records larger than this many pixels (height x width); default "
                   "89478485, the default of convert --max-pixels.")
@click.option("--aspect-buckets", "aspect", metavar="AREA[/MULTIPLE[/RATIO]]",
              help="With --order or --grid --augmented: batches of aspect buckets, e.g. "
                   "1048576/64/4 (Loader(buckets=AspectBuckets(area, multiple, max_ratio))).")
@click.option("--token-budget", "budget", metavar="TOKENS[/PATCH[/MAX_SIDE]]",
              help="With --order or --grid --augmented: batches filled to a token budget, "
                   "e.g. 8192/16/512 (Loader(buckets=TokenBudget(tokens, patch, max_side))).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--mix", multiple=True, type=DATASET, help="With --order: read DST mixed with "
              "this data set (repeat for more); shows each set's share per batch.")
@click.option("--weights", help="With --mix: comma-separated weights, DST's first (default: "
              "proportional to the sets' sizes).")
@click.option("--samples-per-epoch", type=int, help="With --mix: the mixture's epoch length.")
@click.option("--mix-epoch", type=click.Choice(["sum", "largest", "smallest"]),
              help="With --mix: the epoch length rule instead (default sum).")
def inspect(dst, shard, sample, grid, augmented, grid_count, order, shuffle, epoch,
            world_size, rank, batch_size, drop_last, seed, max_pixels, aspect, budget, as_json,
            mix, weights, samples_per_epoch, mix_epoch):
    """Summarise the packed data set in DST, a folder or s3://, gs:// or az://bucket/prefix
    (or one shard, one sample, a contact sheet, or the sample order a Loader will read)."""
    from dlpack_io.reader.format import DEFAULT_MAX_PIXELS, FormatError
    from dlpack_io.tools import inspection, render

    limit = {"max_pixels": max_pixels or DEFAULT_MAX_PIXELS}
    if augmented and not grid:
        fail("--augmented draws the contact sheet as the Loader yields it: give --grid FILE too")
    try:
        buckets = _buckets(aspect, budget)
        if order and mix:
            from dlpack_io.tools.mix_report import format_mixture_report, mixture_report

            data = mixture_report([dst, *mix], weights=_weights(weights),
                                  samples_per_epoch=samples_per_epoch, epoch_rule=mix_epoch,
                                  seed=seed, epoch=epoch, world_size=world_size, rank=rank,
                                  batch_size=batch_size, drop_last=drop_last,
                                  shuffle=None if shuffle == "none" else shuffle)
            text = format_mixture_report(data)
        elif order:
            from dlpack_io.tools.order_report import format_order_report, order_report

            data = order_report(dst, seed=seed, epoch=epoch, world_size=world_size, rank=rank,
                                batch_size=batch_size, drop_last=drop_last, buckets=buckets,
                                shuffle=None if shuffle == "none" else shuffle)
            text = format_order_report(data)
        elif grid:
            data, text = _sheet(dst, grid, augmented, grid_count, seed, limit, buckets)
        elif shard is not None:
            data = inspection.shard_detail(dst, shard, **limit)
            text = render.shard_text(data)
        elif sample is not None:
            data = inspection.record_detail(dst, sample, **limit)
            text = render.record_text(data)
        else:
            data = inspection.summary(dst, **limit)
            text = render.summary_text(data)
    except (FormatError, FileNotFoundError, IndexError, ValueError, ImportError, OSError) as exc:
        fail(str(exc))
    if as_json:
        return echo_json(data)
    click.echo(text)


def _buckets(aspect, budget):
    """The bucketing of --aspect-buckets / --token-budget (None without either)."""
    if aspect and budget:
        raise ValueError("--aspect-buckets and --token-budget: give one")
    if not (aspect or budget):
        return None
    from dlpack_io.reader import AspectBuckets, TokenBudget

    text, cls = (aspect, AspectBuckets) if aspect else (budget, TokenBudget)
    keys = ("area", "multiple", "max_ratio") if aspect else ("tokens", "patch", "max_side")
    parts = text.split("/")
    if len(parts) > 3 or not all(p.strip() for p in parts):
        raise ValueError(f"{text!r}: expected {'/'.join(keys).upper()} (the first alone is "
                         f"enough)")
    try:
        values = [float(p) if k == "max_ratio" else int(p) for k, p in zip(keys, parts)]
    except ValueError:
        raise ValueError(f"{text!r}: expected numbers, {'/'.join(keys).upper()}") from None
    return cls(**dict(zip(keys, values)))


def _sheet(dst, grid, augmented: bool, count: int, seed: int, limit: dict,
           buckets=None) -> tuple:
    """(data, text) of --grid: the contact sheet, or with --augmented what the Loader
    yields (boxes and masks drawn, tools/targetsheet.py)."""
    from dlpack_io.tools import inspection, render

    if not augmented:
        data = inspection.contact_sheet(dst, grid, count=count, seed=seed, **limit)
        return data, (f"wrote {data['path']} ({data['width']}x{data['height']}, "
                      f"{render.plural(len(data['samples']), 'image')})")
    from dlpack_io.tools.targetsheet import augmented_sheet

    data = augmented_sheet(dst, inspection.sheet_path(grid), count=count, seed=seed,
                           buckets=buckets, **limit)
    text = (f"wrote {data['path']} ({data['width']}x{data['height']}, "
            f"{render.plural(len(data['samples']), 'image')} as the Loader yields them)")
    if data["masks_not_moved"]:
        text += (f"\nWARNING: {render.plural(data['masks_not_moved'], 'mask')} not of the "
                 f"size of the image after the transforms (not drawn): this Loader does not "
                 f"move masks with the image")
    return data, text


def _weights(text):
    """--weights "0.7,0.3" as floats (None when not given)."""
    if text is None:
        return None
    try:
        return [float(w) for w in text.split(",")]
    except ValueError:
        raise ValueError(f"--weights {text!r}: expected comma-separated numbers, e.g. "
                         f"0.7,0.3") from None
