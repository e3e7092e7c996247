"""``dlpack convert SRC DST --append --replace-changed``: an input whose path is packed with
other content is packed again into the append's new shards, and its old record is retired
in the union manifest (reader/format/retired.py holds the rule readers follow). Old shard
bytes never change: a reader that opened the old manifest keeps reading what it knew; one
that opens the new manifest sees the new content at the sample's old index.

A changed input the encoder rejects retires nothing (its old record stays what the data
set shows). Appending without the flag behaves as before: changed inputs are reported.
"""
from __future__ import annotations

from dlpack_io.packer.names import shown
from dlpack_io.packer.packing import packing_order
from dlpack_io.packer.pipeline import ConversionError
from dlpack_io.reader import format as fmt


class PairingError(ConversionError):
    """The new records cannot be paired with the inputs that replace: the append writes
    no manifest and removes its new shards and journal (the data set stays as it was)."""


def replacements(base: dict, inputs, opts, replacing: dict, todo: list, rejects: list,
                 new_records: int) -> tuple[list, list]:
    """(the ``[old, new]`` record pairs this append adds, the paths they replace) from
    ``replacing`` (input number of SRC -> record it retires), ``todo`` (the input number
    in SRC of each of ``inputs.paths``, packed in ``opts``' packing order), ``rejects``
    (this append's (path, reason) rejects) and ``new_records`` (records the new shards
    hold, checked against the inputs packed)."""
    if not replacing:  # nothing to map (a list may name a path twice, one line rejected)
        return [], []
    refused = {path for path, _ in rejects}
    packed = [(todo[p], shown(inputs.paths[p]))
              for p in packing_order(len(inputs.paths), opts).tolist()
              if shown(inputs.paths[p]) not in refused]
    if len(packed) != new_records:
        raise PairingError(f"the new shards hold {new_records} records for {len(packed)} "
                           f"inputs packed; cannot tell which record replaces which, so no "
                           f"manifest was written and the new shards were removed: a path "
                           f"the list names on several lines was rejected on some of them "
                           f"only; fix or drop those lines, then append again")
    first = base["num_samples"]
    done = [(replacing[i], first + k, path) for k, (i, path) in enumerate(packed)
            if i in replacing]
    return [[old, new] for old, new, _ in done], [path for _, _, path in done]


def with_retired(manifest: dict, base: dict, pairs: list) -> dict:
    """``manifest`` (the union, before its checksum) retiring the data set's records and
    ``pairs``: version RETIRING_VERSION, fields declared; unchanged without any."""
    every = sorted(fmt.retired_pairs(base) + pairs)
    if not every:
        return manifest
    union = dict(manifest, version=fmt.RETIRING_VERSION, fields=manifest.get("fields") or {},
                 **{fmt.RETIRED_KEY: every})
    try:  # what readers check, before a manifest they would refuse is written
        fmt.check_retired(union, "the union manifest")
    except fmt.FormatError as exc:
        raise ConversionError(f"{exc}; no manifest was written (a bug: please report it "
                              f"with the list or folder appended)") from None
    return union
