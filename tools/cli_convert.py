"""``dlpack convert SRC DST``: the click command over ``dlpack_io.packer.conversion.convert``
and the summary it prints."""
from __future__ import annotations

import sys

import click

from dlpack_io.tools.cli_common import LazyChoice, echo_json, fail


@click.command()
@click.argument("src")
@click.argument("dst", type=click.Path(file_okay=False))
@click.option("--list", "list_file", type=click.Path(exists=True, dir_okay=False),
              help="CSV/TSV of 'path,label' rows (paths relative to SRC) instead of class "
                   "sub-folders. Labels are class names or integers. Extra columns become "
                   "str fields (named by a header row). FILE.jsonl: one JSON object per "
                   "line, {\"path\": ..., \"label\": ..., other keys: fields}.")
@click.option("--from", "source_format", default="auto", show_default=True,
              type=LazyChoice("dlpack_io.packer.containers", "FORMATS"),
              help="What SRC is: folder (class sub-folders, --list, --no-labels), webdataset "
                   "(.tar files: a file, a folder, a brace pattern like "
                   "'train-{0000..0099}.tar'), parquet, tfrecord (gzip'd too) or recordio "
                   "(.rec, with its .idx). SRC may then be s3://, gs:// or az://. auto: by "
                   "the suffix of SRC or of the files in it. See docs/formats.md.")
@click.option("--image-key", "--image-column", "image_key", metavar="KEY",
              help="Where the image is: a tar member suffix (default jpg/jpeg/png/webp), a "
                   "Parquet column (default: the datasets Image column) or a TFRecord "
                   "feature (default image/encoded).")
@click.option("--label-key", "--label-column", "label_key", metavar="KEY",
              help="Where the label is: tar suffix (default cls, else cls2), Parquet column "
                   "(default: the datasets ClassLabel column, else 'label'), TFRecord feature "
                   "(default image/class/label; a text feature gives class names).")
@click.option("--spool", type=click.Path(file_okay=False), metavar="DIR",
              help="Folder for bytes that cannot be read where they lie (s3:// sources, "
                   "gzip'd files, Parquet images), removed when the conversion ends "
                   "(default: the system temp folder; needs room for those images).")
@click.option("--format", "data_format", type=LazyChoice("dlpack_io.reader.format", "FORMATS"), default="record",
              show_default=True, help="Our mmap-friendly record shards, or sharded LMDB.")
@click.option("--mode", type=LazyChoice("dlpack_io.reader.format", "MODES"), default="jpeg", show_default=True,
              help="jpeg: keep the original JPEG bytes; raw: store decoded RGB uint8 pixels; "
                   "planes: store each JPEG's decoded Y/Cb/Cr planes (same pixels as jpeg, "
                   "~2.1x the bytes, no Huffman decoding or IDCT when read).")
@click.option("--size", type=int, help="raw mode: resize the shorter side to SIZE and "
              "center-crop SIZE x SIZE, so batches are dense arrays.")
@click.option("--max-side", type=int, help="Bound the longer side to MAX_SIDE pixels, keeping "
              "the aspect ratio (jpeg mode re-encodes such images at --quality; planes mode "
              "stores them as raw pixels).")
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
@click.option("--non-jpeg", type=LazyChoice("dlpack_io.packer.options", "NON_JPEG"), default="keep",
              show_default=True,
              help="Images that are not JPEGs by content (PNG, WebP, BMP, TIFF, GIF, also "
                   "when named .jpg): keep = store a PNG or WebP file as it is (its size "
                   "kept; decoded with PIL on read to the same pixels a raw record holds), "
                   "the others as raw; raw = store their upright RGB pixels losslessly as raw "
                   "records (larger, no decode on read), jpeg = re-encode at --quality (lossy), reject = skip "
                   "them (listed in rejects.tsv). Counted in the summary either way. JPEGs "
                   "(grayscale, CMYK, EXIF-rotated included) always keep their bytes. Files "
                   "whose suffix is not an image suffix are ignored and counted.")
@click.option("--max-pixels", type=int, default=None,
              help="Reject images of more than this many pixels (width x height) before "
                   "decoding them, naming the size in rejects.tsv (a decompression-bomb "
                   "guard). Default 89478485, where Pillow starts warning of a bomb.")
@click.option("--fields", "fields", default=None, metavar="NAMES",
              help="Fields to pack beside image and label: sidecar files next to each image "
                   "(name.txt, .json, .cls, .npy: fields txt, json, cls, npy) or a list's "
                   "extra keys/columns. Default: every one found; 'none'; or e.g. txt,json.")
@click.option("--coco", type=click.Path(exists=True, dir_okay=False), metavar="JSON",
              help="COCO object detection annotations (instances_*.json): every image of the "
                   "file, found under SRC by file_name, with fields boxes (float32 [N, 4] "
                   "x0, y0, x1, y1 pixels of the upright image), categories (COCO ids; names "
                   "in the manifest), iscrowd and image_id. A bad annotation is left out "
                   "(in rejects.tsv with its id and the reason) and its image packed.")
@click.option("--masks", "masks", type=click.Path(exists=True, file_okay=False), metavar="DIR",
              help="Semantic masks: a tree mirroring SRC with one PNG label map per image "
                   "(a/x.jpg -> DIR/a/x.png; modes P, L, I;16), stored losslessly as field "
                   "mask. Without it, a sidecar x.mask.png beside x.jpg is the mask.")
@click.option("--skip-empty", is_flag=True,
              help="Leave out images without any box (default: packed with N = 0 boxes).")
@click.option("--on-error", type=LazyChoice("dlpack_io.packer.options", "ON_ERROR"), default="skip", show_default=True,
              help="skip: list bad inputs in rejects.tsv and go on; fail: stop at the first.")
@click.option("--max-rejects", default="0", show_default=True, metavar="N|P%",
              help="Rejects accepted without complaint: a count (10) or a percentage of the "
                   "inputs (0.5%). Above it the data set is still complete (every input but "
                   "those listed in rejects.tsv) and the command exits with code 3.")
@click.option("--no-labels", is_flag=True,
              help="SRC is a folder of images without class sub-folders (self-supervised, "
                   "retrieval): every image under SRC, at any depth, is packed with label -1 "
                   "and the data set has no classes.")
@click.option("--no-provenance", is_flag=True,
              help="Leave the host name and the absolute paths of SRC and the --list file out "
                   "of the manifest (for a data set meant for sharing). Relative file paths "
                   "inside SRC are kept: they name the samples.")
@click.option("--engine", type=LazyChoice("dlpack_io.packer.engines", "ENGINES"), default="local", show_default=True,
              help="local: worker processes on this machine. ray: tasks on a Ray cluster "
                   "(pip install 'dlpack-io[ray]'); same bytes as local, resumable. SRC must be a "
                   "path every node sees (shared file system); DST too, or s3://... (each "
                   "node then uploads its shards with its own AWS credentials).")
@click.option("--ray-address", metavar="ADDRESS",
              help="With --engine ray: the cluster to use (HOST:PORT of `ray start --head`, or "
                   "'auto' for the one running here). Default: $RAY_ADDRESS, else a private "
                   "cluster on this machine with --workers CPUs.")
@click.option("--resume", is_flag=True, help="Finish an interrupted conversion into DST.")
@click.option("--append", is_flag=True,
              help="Add to the data set in DST the inputs of SRC it does not hold yet (same "
                   "path and same content: skipped), as new shards after its own, then a new "
                   "manifest; old shards are not touched, new class folders get new class "
                   "indices, the packing options are the data set's. --resume finishes an "
                   "interrupted append.")
@click.option("--replace-changed", is_flag=True,
              help="With --append: pack an input whose path is in DST with other content "
                   "again and retire its old record (old shards are not touched; the sample "
                   "keeps its index and shows the new content). Without it, changed inputs "
                   "are reported and left as they are.")
@click.option("--checksum", is_flag=True,
              help="With --append: hash every file of SRC whose path is packed already (like "
                   "rsync -c). Without it, a file whose size and modification time are those "
                   "recorded when it was packed counts as already there unread; a file "
                   "rewritten with the same size and its old mtime restored is then missed.")
@click.option("--staging", type=click.Path(file_okay=False),
              help="DST s3://, gs:// or az://...: local folder for shards waiting to be uploaded (default: the "
                   "system temp folder; needs room for about two shards).")
@click.option("--overwrite", is_flag=True, help="Replace a data set already in DST.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def convert(src, dst, list_file, source_format, image_key, label_key, spool, data_format, mode, size, max_side, quality, shard_size,
            workers, seed, shuffle, validate, restart_markers, non_jpeg, max_pixels, fields,
            coco, masks, skip_empty, on_error, max_rejects, no_labels, no_provenance, engine,
            ray_address, resume, append, replace_changed, checksum, staging, overwrite, quiet,
            as_json):
    """Pack the images under SRC (class sub-folders, --list, or --no-labels; or WebDataset
    tars, Parquet, TFRecord or RecordIO files: --from) into shards in DST. DST must lie outside SRC. Symlinks in SRC are followed (each real folder once) and
    counted in the summary.

    DST may be s3://bucket/prefix, gs://bucket/prefix or az://container/prefix (needs pip
    install 'dlpack-io[s3]'; credentials and endpoint from each cloud's usual variables, see
    docs/remote.md): each shard is uploaded as it is finished, the
    manifest last, and the journal kept in the bucket so --resume works from any machine.

    Files and folders whose name starts with "." are skipped and counted in the summary.

    \b
    Exit codes: 0 done; 1 failed (the message names the command that retries);
    2 usage error; 3 done, but more rejects than --max-rejects (listed in rejects.tsv);
    130 interrupted (Ctrl-C; the message names the command that resumes).
    """
    from dlpack_io.packer.conversion import convert as run
    from dlpack_io.packer.records import ConversionError
    from dlpack_io.tools import convert_outcome as outcome

    try:
        limit = outcome.parse_max_rejects(max_rejects)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--max-rejects") from None
    packing = dict(format=data_format, mode=mode, size=size, max_side=max_side,
                   quality=quality, shard_size=shard_size, seed=seed, shuffle=shuffle,
                   validate=validate, jpeg_restarts=restart_markers, non_jpeg=non_jpeg,
                   fields=fields, max_pixels=max_pixels, coco=coco, masks=masks,
                   skip_empty=skip_empty, source_format=source_format, image_key=image_key,
                   label_key=label_key, spool=spool)
    packing = append_options(packing, append, replace_changed, checksum)
    try:
        result = run(src, dst, list_file=list_file, resume=resume, overwrite=overwrite,
                     labels=not no_labels, provenance=not no_provenance,
                     **packing,  # None: not given (the default, or on --append the set's)
                     workers=workers, on_error=on_error, progress=not quiet, engine=engine,
                     ray_address=ray_address, append=append, staging=staging)
    except (ConversionError, ValueError, RuntimeError, FileNotFoundError, ImportError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail(f"interrupted (Ctrl-C); to finish this conversion run: "
             f"{outcome.resume_command(sys.argv[1:], dst)}", outcome.EXIT_INTERRUPTED)
    finish(result, as_json, limit)


def append_options(packing: dict, append: bool, replace_changed: bool,
                   checksum: bool = False) -> dict:
    """``packing`` for this run: with --append, only the options given on the command line
    (the others are the data set's, from its manifest)."""
    if append:
        from dlpack_io.tools.append_report import given_only
        return dict(given_only(click.get_current_context(), packing),
                    **({"replace_changed": True} if replace_changed else {}),
                    **({"checksum": True} if checksum else {}))
    if replace_changed or checksum:
        raise click.UsageError("--replace-changed and --checksum go with --append")
    return packing


def finish(result: dict, as_json: bool, limit) -> None:
    """Print the summary (or JSON), the rejects line, and exit 3 above ``limit``."""
    from dlpack_io.tools import convert_outcome as outcome

    if result.get("append") is not None:
        from dlpack_io.tools.append_report import append_lines
        if not as_json:
            click.echo("\n".join(append_lines(result)))
        if result.get("nothing_new"):
            return echo_json(result) if as_json else None
    if result.get("already_complete"):
        return echo_json(result) if as_json else \
            click.echo(f"{result['dst']} is already complete; nothing to resume")
    line, over = outcome.rejects_verdict(result["rejects"], result["num_samples"], limit,
                                         f"{result['dst'].rstrip('/')}/rejects.tsv")
    if as_json:
        echo_json(result)
    else:
        echo_summary(result)
        if line:
            click.echo(line, err=True)
    if over:
        sys.exit(outcome.EXIT_REJECTS)


def packed_line(result: dict) -> str:
    """The first summary line: what this run packed, at which rate; after --resume or
    --append (this run packed part of the data set) also what the data set now holds."""
    from dlpack_io.tools.render import human_bytes, plural

    whole = (f"{plural(result['num_samples'], 'image')} in {plural(result['num_shards'], 'shard')}"
             f" ({human_bytes(result['num_bytes'])})")
    rate = (f"in {result['seconds']:.1f} s: {result['images_per_s']:.0f} images/s, "
            f"{result['mb_per_s']:.1f} MB/s read")
    if not result.get("resumed_from") and result.get("append") is None:
        return f"packed {whole.replace(' in ', ' into ', 1)} {rate}"
    how = f"resumed at input {result['resumed_from']}" if result.get("resumed_from") else \
        "appended"
    return (f"packed {plural(result.get('run_samples', 0), 'image')} this run {rate} ({how}); "
            f"the data set holds {whole}")


def echo_summary(result: dict) -> None:
    """Print what a conversion did: rates, what became of the inputs, links, empty classes."""
    from dlpack_io.tools import render
    from dlpack_io.tools.render import plural

    click.echo(packed_line(result))
    click.echo(render.convert_counts(result))
    if result.get("fields"):
        found = result.get("sidecars") or {}  # sidecar files found per field: not "ignored"
        click.echo("fields: " + ", ".join(
            f"{name} ({spec['type']}" + (f", {plural(found[name], 'sidecar file')} found"
                                         if name in found else "") + ")"
            for name, spec in result["fields"].items()))
    if result["via_links"] or result["repeated_dirs"]:
        click.echo(f"symlinks: {plural(result['via_links'], 'input')} reached through a link, "
                   f"{result['outside_src']} of them outside SRC; "
                   f"{plural(result['repeated_dirs'], 'folder')} reached again (a loop or an "
                   f"alias) and skipped")
    if result.get("hidden_files") or result.get("hidden_dirs"):
        click.echo(f"hidden: {plural(result['hidden_files'], 'file')} and "
                   f"{plural(result['hidden_dirs'], 'folder')} whose name starts with '.' "
                   f"skipped (torchvision's ImageFolder would read them)")
    if result["empty_classes"]:
        click.echo(f"WARNING: {plural(len(result['empty_classes']), 'class', 'classes')} with "
                   f"no packed image: {', '.join(result['empty_classes'][:10])}", err=True)
