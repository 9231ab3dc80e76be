"""Shards: dtype choice, the .bin/.idx layout, rollover, memory-mapped reading, corruption checks."""

from __future__ import annotations

import hashlib
import json
import re

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
    load_direction,
    load_split,
)
from nmtkit.errors import UserError


def test_dtype_for_vocab():
    assert dtype_for_vocab(4) == np.uint8
    assert dtype_for_vocab(256) == np.uint8
    assert dtype_for_vocab(257) == np.uint16
    assert dtype_for_vocab(65536) == np.uint16
    assert dtype_for_vocab(65537) == np.uint32
    # ids 0 .. 2**32 - 1 still fit in uint32; one more entry does not
    assert dtype_for_vocab(1 << 32) == np.uint32
    with pytest.raises(ValueError, match=r"^vocabulary of 4294967297 entries does not fit in uint32$"):
        dtype_for_vocab((1 << 32) + 1)


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


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_writer_reports_checksums_of_both_files(tmp_path):
    w = ShardWriter(tmp_path / "c.bin", tmp_path / "c.idx", np.dtype("u1"))
    w.add(*_flat([[9, 8], [7]]))
    info = w.close()
    # checked against hashlib over the bytes on disk (the manifest records these)
    assert info.bin_sha256 == hashlib.sha256(bytes([9, 8, 7])).hexdigest() == _sha(tmp_path / "c.bin")
    assert info.idx_sha256 == _sha(tmp_path / "c.idx")
    assert info.idx_sha256 != hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize("dtype,sents", [
    ("uint8", [[0, 255], [17]]),
    ("uint16", [[256, 65535], [], [1]]),  # values that need the wider dtype
    ("uint32", [[65536], [4294967295, 3]]),
])
def test_round_trip_per_dtype(tmp_path, dtype, sents):
    w = ShardSetWriter(tmp_path, "train", "de", np.dtype(dtype), shard_size=100)
    w.add(*_flat(sents))
    (info,) = w.close()
    assert info.dtype == dtype
    # the .bin holds the ids little-endian, itemsize bytes each, as documented
    width = np.dtype(dtype).itemsize
    expect = b"".join(t.to_bytes(width, "little") for s in sents for t in s)
    assert (tmp_path / info.bin).read_bytes() == expect
    sh = IndexedShard(tmp_path / info.bin, tmp_path / info.idx, dtype)
    assert [sh[i].tolist() for i in range(len(sh))] == sents
    assert sh.sizes.tolist() == [len(s) for s in sents]
    assert sh.tokens.dtype == np.dtype(dtype) and len(sh.tokens) == sum(map(len, sents))


def test_set_writer_keeps_its_dtype_for_every_shard(tmp_path):
    w = ShardSetWriter(tmp_path, "train", "en", np.dtype("<u2"), shard_size=2)
    w.add(*_flat([[1, 2], [3], [4, 5, 6]]))
    infos = w.close()
    assert [i.dtype for i in infos] == ["uint16", "uint16"]
    assert (tmp_path / infos[1].bin).read_bytes() == np.array([4, 5, 6], "<u2").tobytes()
    # closing again changes nothing (no new empty shard, same list)
    assert w.close() == infos and len(list(tmp_path.glob("*.bin"))) == 2


def test_set_writer_refuses_ids_that_disagree_with_lengths(tmp_path):
    w = ShardSetWriter(tmp_path, "train", "en", np.dtype("u1"), shard_size=2)
    with pytest.raises(ValueError, match=r"^2 ids but the lengths add up to 3$"):
        w.add(np.array([1, 2]), np.array([1, 2]))


def test_shards_are_read_only_views(tmp_path):
    w = ShardWriter(tmp_path / "r.bin", tmp_path / "r.idx", np.dtype("u1"))
    w.add(*_flat([[1, 2, 3]]))
    w.close()
    before = (tmp_path / "r.bin").read_bytes(), (tmp_path / "r.idx").read_bytes()
    sh = IndexedShard(tmp_path / "r.bin", tmp_path / "r.idx", "uint8")
    # a reader must never be able to change a data directory through its maps
    assert not sh.offsets.flags.writeable and not sh.tokens.flags.writeable
    with pytest.raises(ValueError):
        sh.tokens[0] = 7
    del sh
    assert ((tmp_path / "r.bin").read_bytes(), (tmp_path / "r.idx").read_bytes()) == before


def test_all_empty_shard_has_an_empty_token_array(tmp_path):
    w = ShardWriter(tmp_path / "e.bin", tmp_path / "e.idx", np.dtype("<u2"))
    w.add(*_flat([[], []]))
    w.close()
    sh = IndexedShard(tmp_path / "e.bin", tmp_path / "e.idx", "uint16")
    assert sh.tokens.dtype == np.uint16 and len(sh.tokens) == 0
    assert sh.sizes.tolist() == [0, 0]


def test_exact_corruption_messages(tmp_path):
    w = ShardWriter(tmp_path / "a.bin", tmp_path / "a.idx", np.dtype("<u2"))
    w.add(*_flat([[1, 2, 3], [4]]))
    w.close()
    a_bin, a_idx = tmp_path / "a.bin", tmp_path / "a.idx"
    with pytest.raises(UserError) as e:
        IndexedShard(a_bin, a_idx, "uint32")
    assert str(e.value) == f"{a_bin}: 8 bytes but its index says 4 tokens of uint32 (truncated or corrupt)"
    idx = a_idx.read_bytes()
    # an index cut at a byte that is not an offset boundary is still a clean refusal
    a_idx.write_bytes(idx[:-3])
    with pytest.raises(UserError) as e:
        IndexedShard(a_bin, a_idx, "uint16")
    assert str(e.value) == f"{a_idx}: truncated or corrupt shard index ({len(idx) - 3} bytes for 2 sentences)"
    a_idx.write_bytes(idx[:10])  # shorter than the header
    with pytest.raises(UserError, match=re.escape(f"{a_idx}: not an nmtkit shard index (bad header)")):
        IndexedShard(a_bin, a_idx, "uint16")
    a_idx.write_bytes(idx[:8] + np.array([-1], "<i8").tobytes())  # a negative count
    with pytest.raises(UserError, match=re.escape("(16 bytes for -1 sentences)")):
        IndexedShard(a_bin, a_idx, "uint16")


def test_dataset_of_no_shards_is_empty():
    ds = ShardedDataset([])
    assert len(ds) == 0 and ds.num_tokens == 0 and list(ds) == []
    assert ds.sizes.dtype == np.int64 and ds.sizes.tolist() == []
    with pytest.raises(IndexError, match=r"^sentence index 0 out of range for 0 sentences$"):
        ds[0]


def test_dataset_index_bounds(tmp_path):
    w = ShardSetWriter(tmp_path, "train", "de", np.dtype("u1"), shard_size=2)
    w.add(*_flat([[4], [5, 6], [7]]))
    infos = w.close()
    ds = ShardedDataset([IndexedShard(tmp_path / i.bin, tmp_path / i.idx, i.dtype) for i in infos])
    assert ds.num_tokens == 4 and ds[-3].tolist() == [4] and ds[np.int64(2)].tolist() == [7]
    with pytest.raises(IndexError, match=r"^sentence index 3 out of range for 3 sentences$"):
        ds[3]
    with pytest.raises(IndexError, match=r"^sentence index -1 out of range for 3 sentences$"):
        ds[-4]


# --- load_split: a data directory written by hand (manifest.json as docs/formats.md describes) ---

def _data_dir(tmp_path):
    """train (2 shards) and valid splits, de in uint16 and en in uint8, manifest with checksums."""
    d = tmp_path / "bin"
    d.mkdir()
    corpus = {
        "train": {"de": [[300, 4], [5], [6, 7, 8]], "en": [[4], [9, 10], [11]]},
        "valid": {"de": [[12]], "en": [[13, 14]]},
    }
    dtypes = {"de": np.dtype("<u2"), "en": np.dtype("u1")}
    splits, files = {}, {"dict.de.txt": "0" * 64}
    for split, by_lang in corpus.items():
        infos = {}
        for lang, sents in by_lang.items():
            w = ShardSetWriter(d, split, lang, dtypes[lang], shard_size=2)
            w.add(*_flat(sents))
            infos[lang] = w.close()
        shards = []
        for k in range(len(infos["de"])):
            entry = {"sentences": infos["de"][k].sentences}
            for lang in ("de", "en"):
                i = infos[lang][k]
                entry[lang] = {"bin": i.bin, "idx": i.idx, "dtype": i.dtype, "tokens": i.tokens}
                files[i.bin], files[i.idx] = i.bin_sha256, i.idx_sha256
            shards.append(entry)
        splits[split] = {"sentences": len(by_lang["de"]), "shards": shards}
    manifest = {"format": "nmtkit-data", "format_version": 1, "complete": True, "source_lang": "de",
                "target_lang": "en", "splits": splits, "files": files}
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d, corpus


def test_load_split_reads_every_split_and_language(tmp_path):
    d, corpus = _data_dir(tmp_path)
    for split in ("train", "valid"):
        for lang in ("de", "en"):
            ds = load_split(d, split, lang)
            assert [x.tolist() for x in ds] == corpus[split][lang], (split, lang)
            assert ds.sizes.tolist() == [len(s) for s in corpus[split][lang]]
    assert len(load_split(d, "train", "de").shards) == 2


def test_load_split_refusals(tmp_path):
    d, _ = _data_dir(tmp_path)
    with pytest.raises(UserError) as e:
        load_split(d, "test", "de")
    assert str(e.value) == f"{d}: no split 'test' (it has train, valid)"
    with pytest.raises(UserError) as e:
        load_split(d, "train", "fr")
    assert str(e.value) == f"{d}: no language 'fr' (it has de and en)"


def test_load_split_verifies_only_its_own_shards_by_default(tmp_path):
    d, corpus = _data_dir(tmp_path)
    # dict.de.txt's listed checksum is wrong and valid.en's .bin is corrupted (same size):
    # neither belongs to train.de, which must load
    p = d / "valid.en.000.bin"
    p.write_bytes(bytes([99]) + p.read_bytes()[1:])
    assert [x.tolist() for x in load_split(d, "train", "de")] == corpus["train"]["de"]
    assert load_split(d, "valid", "en", verify=False)[0].tolist() == [99, 14]  # sizes still match
    with pytest.raises(UserError) as e:
        load_split(d, "valid", "en")  # verify is the default
    assert str(e.value) == f"{p}: checksum mismatch with manifest.json (corrupt or modified file)"
    q = d / "train.en.001.idx"
    raw = q.read_bytes()
    q.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))  # the index checked too, not only the .bin
    with pytest.raises(UserError, match=re.escape(f"{q}: checksum mismatch")):
        load_split(d, "train", "en")


def test_load_split_takes_a_manifest_already_read(tmp_path):
    """generate reads a data directory's manifest once and passes it: then manifest.json is not
    read again, neither to find the shards nor to verify them."""
    d, corpus = _data_dir(tmp_path)
    manifest = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").unlink()
    ds = load_split(d, "train", "en", manifest=manifest)  # verified against the given manifest
    assert [x.tolist() for x in ds] == corpus["train"]["en"]
    with pytest.raises(UserError, match="is not a complete nmtkit data directory"):
        load_split(d, "train", "en")  # without it, the directory's own (gone) is read


def test_load_direction_gives_the_target_side_only_when_it_is_usable(tmp_path):
    """generate's binarized input: the source side, and the target side when the split has one
    of as many sentences (else None); the target is verified before it is used."""
    d, corpus = _data_dir(tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    src, tgt = load_direction(d, m, "train", "de", "en")
    assert [x.tolist() for x in src] == corpus["train"]["de"]
    assert [x.tolist() for x in tgt] == corpus["train"]["en"]
    src, tgt = load_direction(d, m, "valid", "de", "fr")  # no such side: no targets
    assert [x.tolist() for x in src] == corpus["valid"]["de"] and tgt is None
    # a target side of another count (train's second shard of en replaced by valid's one sentence
    # of two tokens: 2 + 1 = 3 sentences still; replace the first instead: 1 + 1 = 2 != 3)
    other = json.loads(json.dumps(m))
    other["splits"]["train"]["shards"][0]["en"] = m["splits"]["valid"]["shards"][0]["en"]
    src, tgt = load_direction(d, other, "train", "de", "en")
    assert len(src) == 3 and tgt is None
    # a target that fails its checksum is an error, not a missing side
    p = d / "train.en.000.bin"
    p.write_bytes(bytes([p.read_bytes()[0] ^ 1]) + p.read_bytes()[1:])
    with pytest.raises(UserError, match=re.escape(f"{p}: checksum mismatch")):
        load_direction(d, m, "train", "de", "en")


def test_load_direction_of_a_multilingual_directory_reads_the_directions_split(tmp_path):
    d, corpus = _data_dir(tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    m["splits"]["valid.de-en"] = m["splits"].pop("valid")  # KIND.SRC-TGT, as a multilingual directory names them
    src, tgt = load_direction(d, m, "valid", "de", "en", tagged=True)
    assert [x.tolist() for x in src] == corpus["valid"]["de"] and [x.tolist() for x in tgt] == corpus["valid"]["en"]
    with pytest.raises(UserError) as e:
        load_direction(d, m, "valid", "en", "de", tagged=True)
    assert str(e.value) == f"{d}: no split 'valid.en-de' (the directions of 'valid' are de-en)"
    m["splits"]["valid.fr-en"] = m["splits"]["valid.de-en"]
    with pytest.raises(UserError) as e:
        load_direction(d, m, "valid", "en", "de", tagged=True)
    assert str(e.value) == f"{d}: no split 'valid.en-de' (the directions of 'valid' are de-en, fr-en)"
    with pytest.raises(UserError) as e:
        load_direction(d, m, "test", "de", "en", tagged=True)
    assert str(e.value) == f"{d}: no split 'test.de-en' (the directions of 'test' are none)"
    with pytest.raises(UserError) as e:  # untagged: the split's own name, refused by load_split
        load_direction(d, m, "valid", "de", "en")
    assert str(e.value).startswith(f"{d}: no split 'valid' (it has ")


def test_sizes_between_equals_a_slice_of_sizes_for_every_range(tmp_path):
    """Every range, across the shard boundaries, empty, reversed and beyond either end: the lengths
    read from the index files are the slice of `sizes` (brute force over all ranges)."""
    d, corpus = _data_dir(tmp_path)
    ds = load_split(d, "train", "de")
    assert len(ds.shards) == 2  # guard: a boundary to cross
    sizes = np.array([len(s) for s in corpus["train"]["de"]], np.int64)
    for start in range(-2, len(sizes) + 2):
        for stop in range(-2, len(sizes) + 3):
            got = ds.sizes_between(start, stop)
            assert got.dtype == np.int64
            assert got.tolist() == sizes[max(start, 0):max(stop, 0)].tolist(), (start, stop)
    # larger shards, read from inside: every range of every shard, and across all of them
    sents = [[7] * n for n in (3, 0, 5, 1, 2, 9, 4, 0, 6, 2, 8)]
    w = ShardSetWriter(tmp_path, "big", "de", np.dtype("<u2"), shard_size=4)
    w.add(*_flat(sents))
    infos = w.close()
    shards = [IndexedShard(tmp_path / i.bin, tmp_path / i.idx, i.dtype) for i in infos]
    assert [len(s) for s in shards] == [4, 4, 3]
    for k, shard in enumerate(shards):
        mine = [len(x) for x in sents[4 * k:4 * k + len(shard)]]
        for start in range(len(shard) + 1):
            for stop in range(start, len(shard) + 1):
                got = shard.sizes_between(start, stop)
                assert got.dtype == np.int64 and got.tolist() == mine[start:stop], (k, start, stop)
    big = ShardedDataset(shards)
    lengths = [len(x) for x in sents]
    for start in range(len(sents) + 1):
        for stop in range(len(sents) + 2):
            assert big.sizes_between(start, stop).tolist() == lengths[start:stop], (start, stop)
