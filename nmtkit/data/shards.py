"""Binarized shards: token ids on disk, read back lazily through `numpy.memmap`.

Why this layout: training must stream a corpus of millions of sentences with constant memory and
random access. Each shard is a pair of flat files that the OS pages in on demand:

- `SPLIT.LANG.NNN.bin`: the token ids of all sentences, concatenated, **without** `</s>`, in the
  smallest unsigned dtype that holds the dictionary (uint8 / uint16 / uint32), little-endian.
- `SPLIT.LANG.NNN.idx`: an 16-byte header (magic `NMTKIDX\\x01`, then the sentence count n as
  little-endian int64) followed by n + 1 little-endian int64 offsets (in tokens) into the .bin;
  sentence i is `bin[offsets[i]:offsets[i+1]]`.

The dtype is recorded in manifest.json (and must match the .bin size). Layout: docs/formats.md.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmtkit.data.languages import langs_of, split_name
from nmtkit.errors import UserError

IDX_MAGIC = b"NMTKIDX\x01"
IDX_HEADER_BYTES = 16
OFFSET_DTYPE = np.dtype("<i8")


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """Smallest unsigned little-endian dtype that can hold ids 0 .. vocab_size - 1."""
    if vocab_size <= 1 << 8:
        return np.dtype("u1")
    if vocab_size <= 1 << 16:
        return np.dtype("<u2")
    if vocab_size <= 1 << 32:
        return np.dtype("<u4")
    raise ValueError(f"vocabulary of {vocab_size} entries does not fit in uint32")


def shard_basename(split: str, lang: str, index: int) -> str:
    return f"{split}.{lang}.{index:03d}"


# ---------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardInfo:
    """One finished shard of one language, as recorded in the manifest."""

    bin: str  # file names, relative to the data dir
    idx: str
    dtype: str
    sentences: int
    tokens: int
    bin_sha256: str
    idx_sha256: str


class ShardWriter:
    """Streams sentences into one .bin/.idx pair; hashes the .bin as it goes."""

    def __init__(self, bin_path: str | os.PathLike, idx_path: str | os.PathLike, dtype: np.dtype):
        self.bin_path, self.idx_path = Path(bin_path), Path(idx_path)
        self.dtype = np.dtype(dtype)
        self._bin = open(self.bin_path, "wb")
        self._idx = open(self.idx_path, "wb")
        self._idx.write(IDX_MAGIC + np.zeros(1, OFFSET_DTYPE).tobytes())  # count patched at close
        self._idx.write(np.zeros(1, OFFSET_DTYPE).tobytes())  # offsets[0] = 0
        self._hash = hashlib.sha256()
        self.sentences = 0
        self.tokens = 0

    def add(self, flat_ids: np.ndarray, lengths: np.ndarray) -> None:
        """Append sentences given as their concatenated ids and per-sentence lengths."""
        if len(lengths) == 0:
            return
        data = np.ascontiguousarray(flat_ids, dtype=self.dtype).tobytes()
        self._bin.write(data)
        self._hash.update(data)
        offsets = np.cumsum(lengths, dtype=np.int64) + self.tokens
        self._idx.write(offsets.astype(OFFSET_DTYPE, copy=False).tobytes())
        self.sentences += len(lengths)
        self.tokens = int(offsets[-1])

    def close(self) -> ShardInfo:
        for fh in (self._bin, self._idx):
            if fh is self._idx:
                fh.seek(len(IDX_MAGIC))
                fh.write(np.array([self.sentences], OFFSET_DTYPE).tobytes())
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
        return ShardInfo(
            bin=self.bin_path.name,
            idx=self.idx_path.name,
            dtype=self.dtype.name,
            sentences=self.sentences,
            tokens=self.tokens,
            bin_sha256=self._hash.hexdigest(),
            idx_sha256=_sha256(self.idx_path),
        )


class ShardSetWriter:
    """Writes one split of one language as a sequence of shards of at most `shard_size` sentences."""

    def __init__(self, directory: Path, split: str, lang: str, dtype: np.dtype, shard_size: int,
                 suffix: str = ""):
        self.directory, self.split, self.lang = Path(directory), split, lang
        self.dtype, self.shard_size, self.suffix = np.dtype(dtype), shard_size, suffix
        self.shards: list[ShardInfo] = []
        self._cur: ShardWriter | None = None

    def _open_next(self) -> ShardWriter:
        base = shard_basename(self.split, self.lang, len(self.shards))
        return ShardWriter(self.directory / f"{base}{self.suffix}.bin", self.directory / f"{base}.idx", self.dtype)

    def add(self, flat_ids: np.ndarray, lengths: np.ndarray) -> None:
        """Append sentences, starting a new shard whenever the current one is full."""
        if len(flat_ids) != int(np.sum(lengths)):
            raise ValueError(f"{len(flat_ids)} ids but the lengths add up to {int(np.sum(lengths))}")
        start_sent, start_tok, n = 0, 0, len(lengths)
        while start_sent < n:
            if self._cur is None:
                self._cur = self._open_next()
            take = min(n - start_sent, self.shard_size - self._cur.sentences)
            lens = lengths[start_sent : start_sent + take]
            ntok = int(lens.sum())
            self._cur.add(flat_ids[start_tok : start_tok + ntok], lens)
            start_sent += take
            start_tok += ntok
            if self._cur.sentences >= self.shard_size:
                self.shards.append(self._cur.close())
                self._cur = None

    def close(self) -> list[ShardInfo]:
        if self._cur is not None:
            self.shards.append(self._cur.close())
        if not self.shards:  # an empty split still gets one (empty) shard, so readers find it
            self.shards.append(self._open_next().close())
        self._cur = None
        return self.shards


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------


class IndexedShard:
    """One .bin/.idx pair, memory-mapped; checks sizes (not checksums) when opened."""

    def __init__(self, bin_path: str | os.PathLike, idx_path: str | os.PathLike, dtype: str | np.dtype):
        self.bin_path, self.idx_path = Path(bin_path), Path(idx_path)
        self.dtype = np.dtype(dtype)
        for p in (self.bin_path, self.idx_path):
            if not p.is_file():
                raise UserError(f"{p}: shard file missing")
        idx_bytes = self.idx_path.stat().st_size
        with open(self.idx_path, "rb") as fh:
            header = fh.read(IDX_HEADER_BYTES)
        if len(header) < IDX_HEADER_BYTES or header[: len(IDX_MAGIC)] != IDX_MAGIC:
            raise UserError(f"{self.idx_path}: not an nmtkit shard index (bad header)")
        n = int(np.frombuffer(header[len(IDX_MAGIC) :], OFFSET_DTYPE)[0])
        if n < 0 or idx_bytes != IDX_HEADER_BYTES + (n + 1) * OFFSET_DTYPE.itemsize:
            raise UserError(f"{self.idx_path}: truncated or corrupt shard index ({idx_bytes} bytes for {n} sentences)")
        self.offsets = np.memmap(self.idx_path, dtype=OFFSET_DTYPE, mode="r", offset=IDX_HEADER_BYTES, shape=(n + 1,))
        ntok = int(self.offsets[-1])
        bin_bytes = self.bin_path.stat().st_size
        if bin_bytes != ntok * self.dtype.itemsize:
            raise UserError(
                f"{self.bin_path}: {bin_bytes} bytes but its index says {ntok} tokens of {self.dtype.name} "
                "(truncated or corrupt)"
            )
        # np.memmap cannot map an empty file; an all-empty shard is just an empty array.
        self.tokens = np.memmap(self.bin_path, dtype=self.dtype, mode="r") if ntok else np.zeros(0, self.dtype)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(np.asarray(self.offsets)).astype(np.int64)

    def sizes_between(self, start: int, stop: int) -> np.ndarray:
        """Lengths of sentences start .. stop - 1 (int64), read from the index file, not its mapping.

        Why a read and not the memmap: a pass over the whole index through the mapping leaves every
        page of it counted in this process's resident memory (8 bytes per sentence), while a read
        goes through the page cache only, which all ranks share and the OS can drop.
        """
        if stop <= start:
            return np.zeros(0, np.int64)
        with open(self.idx_path, "rb") as fh:
            fh.seek(IDX_HEADER_BYTES + start * OFFSET_DTYPE.itemsize)
            offsets = np.fromfile(fh, dtype=OFFSET_DTYPE, count=stop - start + 1)
        return np.diff(offsets).astype(np.int64, copy=False)

    def __getitem__(self, i: int) -> np.ndarray:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return np.asarray(self.tokens[a:b], dtype=np.int64)


class ShardedDataset:
    """One split of one language: its shards concatenated, read lazily.

    `ds[i]` is sentence i as an int64 array of dictionary ids without </s>; the token ids stay on
    disk. `ds.sizes_between(a, b)` reads a range of sentence lengths from the indexes (what the
    training batch plan streams through, holding no per-sentence array); `ds.sizes` is every
    length at once (8 bytes per sentence, built on first use and kept).
    """

    def __init__(self, shards: list[IndexedShard]):
        self.shards = shards
        counts = [len(s) for s in shards]
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()

    @functools.cached_property
    def sizes(self) -> np.ndarray:
        return np.concatenate([s.sizes for s in self.shards]).astype(np.int64) if self.shards else np.zeros(0, np.int64)

    def sizes_between(self, start: int, stop: int) -> np.ndarray:
        """Lengths of sentences start .. stop - 1 (int64) across shard boundaries, read from the indexes."""
        start, stop = max(0, int(start)), min(len(self), int(stop))
        parts = []
        k = bisect.bisect_right(self._starts, start) - 1
        while start < stop and k < len(self.shards):
            base = self._starts[k]
            end = min(stop, self._starts[k + 1])
            parts.append(self.shards[k].sizes_between(start - base, end - base))
            start, k = end, k + 1
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def num_tokens(self) -> int:
        return int(sum(int(s.offsets[-1]) for s in self.shards))

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sentence index {i} out of range for {n} sentences")
        k = bisect.bisect_right(self._starts, i) - 1
        return self.shards[k][i - self._starts[k]]

    def __iter__(self):
        for s in self.shards:
            for j in range(len(s)):
                yield s[j]


def load_split(data_dir: str | os.PathLike, split: str, lang: str, verify: bool = True,
               manifest: dict | None = None) -> ShardedDataset:
    """Open `split` ("train", "valid", "test", ...) of language `lang` in a preprocessed data dir.

    Sizes are always checked against the index (cheap); `verify` (the default) also checks the
    sha256 of every shard file against manifest.json, once per file and process
    (nmtkit.data.manifest.verify_files), and raises UserError naming a corrupt file.
    `manifest`: the directory's manifest when the caller has read it already.
    """
    from nmtkit.data.manifest import load_manifest, verify_files

    m = load_manifest(data_dir) if manifest is None else manifest
    if split not in m["splits"]:
        raise UserError(f"{data_dir}: no split {split!r} (it has {', '.join(m['splits'])})")
    langs = langs_of(m) or [m["source_lang"], m["target_lang"]]  # a multilingual directory: all of them
    if lang not in langs:
        raise UserError(f"{data_dir}: no language {lang!r} (it has {' and '.join(langs)})")
    entries = [shard[lang] for shard in m["splits"][split]["shards"]]
    if verify:
        verify_files(data_dir, m, [name for e in entries for name in (e["bin"], e["idx"])])
    d = Path(data_dir)
    return ShardedDataset([IndexedShard(d / e["bin"], d / e["idx"], e["dtype"]) for e in entries])


def load_direction(data_dir: str | os.PathLike, manifest: dict, split: str, src_lang: str, tgt_lang: str,
                   tagged: bool = False) -> tuple[ShardedDataset, ShardedDataset | None]:
    """(source side, target side or None) of `split` for one direction: the target side only
    when the split has one of as many sentences. `tagged`: a multilingual directory, whose
    split is the direction's (`test.de-fr`, its sources tagged); one line names the directions
    it has otherwise. The source's checksums are verified (a flipped byte is an error), the
    target's once it is known to be used."""
    name = split_name(split, src_lang, tgt_lang) if tagged else split
    if tagged and name not in manifest["splits"]:
        have = sorted(k for k in manifest["splits"] if k.startswith(f"{split}."))
        raise UserError(f"{data_dir}: no split {name!r} (the directions of {split!r} are "
                        f"{', '.join(k.split('.', 1)[1] for k in have) or 'none'})")
    src = load_split(data_dir, name, src_lang, manifest=manifest)
    try:
        tgt = load_split(data_dir, name, tgt_lang, verify=False, manifest=manifest)
    except UserError:  # no target side
        return src, None
    if len(tgt) != len(src):
        return src, None
    return src, load_split(data_dir, name, tgt_lang, manifest=manifest)
