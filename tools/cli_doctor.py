"""``dlpack doctor DST``: the click command over ``doctor.diagnose``."""
from __future__ import annotations

import click

from dlpack_io.tools.cli_common import DATASET, echo_json, fail


def _transforms(crop: int, resize_crop: bool, flip: bool, normalize: bool) -> list:
    """The Loader transforms the options describe (the ImageNet training recipe by default)."""
    from dlpack_io.reader import (CenterCrop, Normalize, RandomHorizontalFlip,
                                  RandomResizedCrop)

    out = [RandomResizedCrop(crop) if resize_crop else CenterCrop(crop)]
    if flip:
        out.append(RandomHorizontalFlip())
    if normalize:
        out.append(Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))
    return out


def _settings(workers: str | None) -> list | None:
    """``--workers 1,2,4t,2p``: counts as threads, ``Np`` as processes; None: automatic."""
    if not workers:
        return None
    out = []
    for item in workers.split(","):
        item = item.strip().lower()
        kind = "process" if item.endswith("p") else "thread"
        count = item.rstrip("pt")
        if not count.isdigit() or int(count) < 1 or int(count) > 256:
            raise click.BadParameter(f"{item!r}: expected a worker count 1..256, optionally "
                                     f"followed by t (threads) or p (processes)")
        out.append((int(count), kind))
    return out


def _sample_transform(spec: str | None):
    """``--sample-transform MODULE:NAME``: the user's function, imported (the current
    directory first on the path, as ``python -m`` has it); None without the option."""
    if not spec:
        return None
    import importlib
    import os
    import sys

    module, _, name = spec.partition(":")
    if not module or not name:
        raise click.BadParameter(f"{spec!r}: expected MODULE:FUNCTION, e.g. my_aug:jitter")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(f"{spec!r}: {exc}; expected an importable MODULE:FUNCTION "
                                 f"(run from the folder that holds {module}.py)")
    except Exception as exc:  # the module's own code failed (a syntax error, a raise)
        raise click.BadParameter(f"{spec!r}: importing {module} failed: {type(exc).__name__}: "
                                 f"{exc}; expected an importable MODULE:FUNCTION (python -c "
                                 f"'import {module}' shows the traceback)")
    if not callable(fn):
        raise click.BadParameter(f"{spec!r} is a {type(fn).__name__}, not a function")
    return fn


@click.command()
@click.argument("dst", type=DATASET)
@click.option("--batch-size", type=click.IntRange(1), default=256, show_default=True,
              help="Images per batch, as in your Loader.")
@click.option("--crop", type=click.IntRange(1), default=224, show_default=True,
              help="Output size of the crop.")
@click.option("--resize-crop/--center-crop", default=True, show_default=True,
              help="RandomResizedCrop (training) or CenterCrop (evaluation).")
@click.option("--flip/--no-flip", default=True, show_default=True,
              help="RandomHorizontalFlip after the crop.")
@click.option("--normalize/--no-normalize", default=False, show_default=True,
              help="Normalize (ImageNet mean and std) to float32 on the host.")
@click.option("--seconds", type=click.FloatRange(0.1), default=10.0, show_default=True,
              help="How long to measure each setting.")
@click.option("--workers", default=None,
              help="Settings to try, e.g. '1,2,4,2p' (t: threads, the default; p: processes); "
                   "default: 1, 2, 4... threads up to the core count and 2... processes.")
@click.option("--sample-transform", "sample_fn", default=None, metavar="MODULE:FUNCTION",
              help="Your Loader sample_transform (a function of one HWC uint8 sample), "
                   "imported from MODULE (the current folder first), run in every setting.")
@click.option("--fields", default="all", show_default=True,
              help="Fields each batch reads, as in your Loader(fields=...), e.g. "
                   "'image,label'; all: every field of the data set (boxes, masks and "
                   "captions cost time too).")
@click.option("--in-use", default="2", show_default=True, metavar="N[t|p]",
              help="The worker setting your training script uses now (the Loader's default: "
                   "2 threads): advised against only when another is clearly faster.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
def doctor(dst, batch_size, crop, resize_crop, flip, normalize, seconds, workers, sample_fn,
           fields, in_use, as_json):
    """Measure how fast this machine feeds training from DST, and with which settings.

    Runs the Loader with your transforms (and --sample-transform), reading every field of
    DST (--fields), for a few seconds per setting, after an untimed warm-up, and prints,
    side by side: the decode-only rate of one core, the Loader's rate for each worker
    setting (with CPU-ms per image, how busy the workers were and where their time went),
    the advice (a setting within the cores, named as a change only when it is at least 10%
    faster than the one in use, else "keep"), and the fastest training step it can feed
    without the step waiting for data. A damaged shard
    or record stops it with exit code 1, naming the file and record ('dlpack verify DST'
    checks them all).
    """
    from dlpack_io.reader import Dataset, FormatError, LoaderError
    from dlpack_io.tools.doctor import diagnose, report_text

    settings, sample_transform = _settings(workers), _sample_transform(sample_fn)
    current = _settings(in_use)
    if len(current) != 1:
        raise click.BadParameter(f"{in_use!r}: one setting, e.g. 2 or 4p", param_hint="--in-use")
    names = None if fields.strip().lower() == "all" else \
        tuple(n.strip() for n in fields.split(",") if n.strip())
    try:
        ds = Dataset(dst)
        report = diagnose(ds, _transforms(crop, resize_crop, flip, normalize),
                          batch_size=batch_size, seconds=seconds, settings=settings,
                          sample_transform=sample_transform, fields=names, in_use=current[0])
    except (FormatError, LoaderError) as exc:  # a damaged shard or record, a worker lost
        fail(f"{dst}: {exc}\n'dlpack verify {dst}' checks every record and names each "
             "damaged one")
    except (OSError, ValueError) as exc:
        fail(f"{dst}: {exc}")
    if as_json:
        echo_json(report)
    else:
        click.echo(report_text(report))
