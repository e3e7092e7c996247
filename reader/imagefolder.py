"""torchvision ImageFolder's attributes on a Dataset: ``classes``, ``class_to_idx``,
``targets``, ``samples`` and ``source(i)``, the file a sample was packed from.

The source paths come from the shards' metadata (each shard lists the path of each of its
records relative to the source folder, always); the folder itself is in the manifest unless
the data set was packed with ``--no-provenance``. Both are read from files we do not trust:
every path is checked to be text, one per record, before it is handed out.
"""
from __future__ import annotations

import posixpath

from dlpack_io.reader.format import FormatError


class ImageFolderAttributes:
    """Mixed into Dataset: reads ``self.manifest``, ``self.shards``, ``self.locate``,
    ``self.record_of`` and ``self.labels``."""

    @property
    def class_to_idx(self) -> dict:
        """{class name: label}, as ImageFolder's (empty for a data set without labels)."""
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def targets(self) -> list:
        """The label of every sample in sample order, a list of ints as ImageFolder's
        (``labels`` is the same as an int64 array)."""
        return self.labels.tolist()

    @property
    def source_root(self) -> str | None:
        """The source folder this data set was packed from, as it was named on the machine
        that packed it; None when packed with ``--no-provenance``."""
        return self.manifest["source"].get("root")

    def source(self, i: int, *, relative: bool = False) -> str:
        """The file sample ``i`` was packed from: its path joined to the source folder, or
        with ``relative=True`` its path inside that folder (kept even with
        ``--no-provenance``)."""
        k, j = self.locate(i)
        rel = self._shard_paths(k)[j]
        return rel if relative else posixpath.join(self._root_or_raise(), rel)

    @property
    def samples(self) -> list:
        """[(source path, label), ...] in sample order, as ImageFolder's ``samples``."""
        root = self._root_or_raise()
        paths = [posixpath.join(root, p) for k in range(len(self.shards))
                 for p in self._shard_paths(k)]
        if len(paths) != len(self):  # an append retired records: samples in sample order
            paths = [paths[self.record_of(i)] for i in range(len(self))]
        return list(zip(paths, self.targets))

    def _root_or_raise(self) -> str:
        root = self.source_root
        if root is None:
            raise ValueError(f"{self.path}: packed with --no-provenance, so the manifest does not "
                             f"name the source folder and there are no full source paths; "
                             f"ds.source(i, relative=True) gives a sample's path inside the "
                             f"source folder, or re-pack without --no-provenance")
        return root

    def _shard_paths(self, k: int) -> list:
        """Shard ``k``'s source paths (relative), checked: one text path per record."""
        cache = self.__dict__.setdefault("_source_paths", {})
        if k not in cache:
            shard = self.shards[k]
            paths = shard.meta().get("paths")
            expected = self.manifest["shards"][k]["num_samples"]
            if not isinstance(paths, list) or len(paths) != expected or \
                    not all(isinstance(p, str) for p in paths):
                got = f"{len(paths)} entries" if isinstance(paths, list) else repr(type(paths))
                raise FormatError(f"{shard.path}: metadata 'paths' must list the source path of "
                                  f"each of its {expected} records, got {got}: the shard does "
                                  f"not record where its samples came from (or is damaged); "
                                  f"dlpack verify checks it")
            cache[k] = paths
        return cache[k]
