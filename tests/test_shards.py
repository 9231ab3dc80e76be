"""Shards: dtype choice, the .bin/.idx layout, rollover, memory-mapped reading, corruption checks."""

from __future__ import annotations

import numpy as np
import pytest

from nmtkit.data.shards import (
    IDX_HEADER_BYTES,
    IDX_MAGIC,
    IndexedShard,
    ShardedDataset,
    ShardSetWriter,
    ShardWriter,
    dtype_for_vocab,
)
from nmtkit.errors import UserError


def test_dtype_for_vocab():
    assert dtype_for_vocab(4) == np.uint8
    assert dtype_for_vocab(256) == np.uint8
    assert dtype_for_vocab(257) == np.uint16
    assert dtype_for_vocab(65536) == np.uint16
    assert dtype_for_vocab(65537) == np.uint32


def _flat(sents):
    lens = np.array([len(s) for s in sents], dtype=np.int64)
    flat = np.array([t for s in sents for t in s], dtype=np.int64)
    return flat, lens


def test_layout_is_as_documented(tmp_path):
    w = ShardWriter(tmp_path / "x.bin", tmp_path / "x.idx", np.dtype("<u2"))
    w.add(*_flat([[5, 6, 7], [], [300]]))
    info = w.close()
    assert (info.sentences, info.tokens, info.dtype) == (3, 4, "uint16")
    assert (tmp_path / "x.bin").read_bytes() == np.array([5, 6, 7, 300], "<u2").tobytes()
    idx = (tmp_path / "x.idx").read_bytes()
    assert idx[:8] == IDX_MAGIC
    assert np.frombuffer(idx[8:16], "<i8").tolist() == [3]
    assert np.frombuffer(idx[IDX_HEADER_BYTES:], "<i8").tolist() == [0, 3, 3, 4]


def test_rollover_and_concatenated_reading(tmp_path):
    sents = [[i % 7 + 4] * (i % 5) for i in range(11)]  # includes empty sentences
    w = ShardSetWriter(tmp_path, "train", "de", np.dtype("u1"), shard_size=4)
    flat, lens = _flat(sents)
    k = int(lens[:3].sum())
    w.add(flat[:k], lens[:3])  # arrive in uneven batches
    w.add(flat[k:], lens[3:])
    with pytest.raises(ValueError):
        w.add(flat[:2], lens[:3])  # ids and lengths that disagree are a bug, caught
    infos = w.close()
    assert [i.sentences for i in infos] == [4, 4, 3]
    assert [i.bin for i in infos] == ["train.de.000.bin", "train.de.001.bin", "train.de.002.bin"]
    ds = ShardedDataset([IndexedShard(tmp_path / i.bin, tmp_path / i.idx, i.dtype) for i in infos])
    assert len(ds) == 11
    assert ds.sizes.dtype == np.int64 and ds.sizes.tolist() == [len(s) for s in sents]
    assert [ds[i].tolist() for i in range(11)] == sents
    assert ds[-1].tolist() == sents[-1] and ds[0].dtype == np.int64
    assert [x.tolist() for x in ds] == sents
    with pytest.raises(IndexError):
        ds[11]


def test_empty_split_gets_one_empty_shard(tmp_path):
    infos = ShardSetWriter(tmp_path, "test", "en", np.dtype("u1"), 10).close()
    assert len(infos) == 1 and infos[0].sentences == 0
    sh = IndexedShard(tmp_path / infos[0].bin, tmp_path / infos[0].idx, "uint8")
    assert len(sh) == 0


def test_all_empty_sentences_read_back(tmp_path):
    w = ShardSetWriter(tmp_path, "valid", "en", np.dtype("u1"), 10)
    w.add(*_flat([[], [], []]))
    (info,) = w.close()
    sh = IndexedShard(tmp_path / info.bin, tmp_path / info.idx, "uint8")  # 0-byte .bin cannot be mmapped
    assert [sh[i].tolist() for i in range(3)] == [[], [], []]


def test_truncated_or_foreign_files_are_user_errors(tmp_path):
    w = ShardWriter(tmp_path / "a.bin", tmp_path / "a.idx", np.dtype("<u2"))
    w.add(*_flat([[1, 2, 3], [4]]))
    w.close()
    data = (tmp_path / "a.bin").read_bytes()
    (tmp_path / "a.bin").write_bytes(data[:-2])
    with pytest.raises(UserError, match=r"a\.bin: 6 bytes but its index says 4 tokens of uint16"):
        IndexedShard(tmp_path / "a.bin", tmp_path / "a.idx", "uint16")
    (tmp_path / "a.bin").write_bytes(data)
    # the dtype recorded in the manifest must match the file size too
    with pytest.raises(UserError, match="truncated or corrupt"):
        IndexedShard(tmp_path / "a.bin", tmp_path / "a.idx", "uint32")
    idx = (tmp_path / "a.idx").read_bytes()
    (tmp_path / "a.idx").write_bytes(idx[:-8])
    with pytest.raises(UserError, match=r"a\.idx: truncated"):
        IndexedShard(tmp_path / "a.bin", tmp_path / "a.idx", "uint16")
    (tmp_path / "a.idx").write_bytes(b"GARBAGE!" + idx[8:])
    with pytest.raises(UserError, match="bad header"):
        IndexedShard(tmp_path / "a.bin", tmp_path / "a.idx", "uint16")
    (tmp_path / "a.idx").unlink()
    with pytest.raises(UserError, match="missing"):
        IndexedShard(tmp_path / "a.bin", tmp_path / "a.idx", "uint16")
