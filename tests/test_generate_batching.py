"""How `generate` and the Translator cut their input into work: chunks of --buffer-size
sentences, batches by --batch-size / --max-tokens (sizes worked out by hand below), the padded
source tensor, the truncation warnings, and `Translator.translate_items`, whose batched results
must equal one sentence searched at a time.

Fast unit tests (a tiny random Transformer built in memory, no data directory): test_generate.py
checks the same rules end to end through the CLI.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nmtkit.generation.generator import chunks
from nmtkit.search.beam import SearchConfig, search
from nmtkit.backends.pytorch.engine import TorchEngine, collate_source
from nmtkit.generation.items import DEFAULT_BATCH_SIZE, MAX_WARNINGS, Item, Truncations, make_batches
from nmtkit.generation.translator import Translator

torch.set_num_threads(1)


def item(index: int, n: int) -> Item:
    """Item `index` of n tokens (ids 4.. so that none is a special symbol)."""
    return Item(index, np.arange(4, 4 + n, dtype=np.int64))


def shape(batches: list[list[Item]]) -> list[list[int]]:
    return [[it.index for it in b] for b in batches]


# --------------------------------------------------------------------------------------------
# make_batches


# lengths of items 0..6; item 3 is empty
LENGTHS = [2, 5, 3, 0, 5, 1, 3]


def test_sorted_longest_first_ties_by_input_order_and_empties_left_out():
    items = [item(i, n) for i, n in enumerate(LENGTHS)]
    # no limit at all: one batch, lengths 5, 5, 3, 3, 2, 1 (ties: lower index first)
    assert shape(make_batches(items, None, None)) == [[1, 4, 2, 6, 0, 5]]
    assert shape(make_batches(list(reversed(items)), None, None)) == [[1, 4, 2, 6, 0, 5]]
    assert make_batches([item(0, 0), item(1, 0)], None, None) == []
    assert make_batches([], 10, 2) == []


@pytest.mark.parametrize("batch_size,want", [
    (1, [[1], [4], [2], [6], [0], [5]]),
    (2, [[1, 4], [2, 6], [0, 5]]),
    (4, [[1, 4, 2, 6], [0, 5]]),
    (6, [[1, 4, 2, 6, 0, 5]]),  # exactly batch_size sentences fit
    (7, [[1, 4, 2, 6, 0, 5]]),
])
def test_batch_size_alone(batch_size, want):
    items = [item(i, n) for i, n in enumerate(LENGTHS)]
    assert shape(make_batches(items, None, batch_size)) == want


@pytest.mark.parametrize("max_tokens,want", [
    # padded cost = rows x (longest + 1 for </s>); the longest row comes first, so width 6 for
    # items 1 and 4: [1, 4] costs 12, adding item 2 would cost 18
    (12, [[1, 4], [2, 6, 0], [5]]),  # [2, 6, 0]: 3 x 4 = 12; + item 5: 16 > 12
    (11, [[1], [4], [2, 6], [0, 5]]),  # 2 x 6 = 12 > 11; [2, 6]: 8, + 0: 12 > 11; [0, 5]: 2 x 3 = 6
    (16, [[1, 4], [2, 6, 0, 5]]),  # [2, 6, 0, 5]: 4 x 4 = 16 (inclusive)
    (15, [[1, 4], [2, 6, 0], [5]]),  # 4 x 4 = 16 > 15
    (36, [[1, 4, 2, 6, 0, 5]]),  # 6 x 6 = 36
    (35, [[1, 4, 2, 6, 0], [5]]),
    (1, [[1], [4], [2], [6], [0], [5]]),  # every sentence over the limit still gets its own batch
])
def test_max_tokens_alone(max_tokens, want):
    items = [item(i, n) for i, n in enumerate(LENGTHS)]
    assert shape(make_batches(items, max_tokens, None)) == want


def test_both_limits_the_first_reached_closes_the_batch():
    items = [item(i, n) for i, n in enumerate(LENGTHS)]
    # max_tokens 16 alone: [[1, 4], [2, 6, 0, 5]]; batch_size 3 also cuts the second batch
    assert shape(make_batches(items, 16, 3)) == [[1, 4], [2, 6, 0], [5]]
    # batch_size 2 alone: [[1, 4], [2, 6], [0, 5]]; max_tokens 10 also cuts [1, 4] (12 > 10)
    assert shape(make_batches(items, 10, 2)) == [[1], [4], [2, 6], [0, 5]]


def test_width_after_a_new_batch_is_the_new_batch_s_own():
    # lengths 9, 1, 1, 1 with max_tokens 10: item 0 alone (cost 10); then the width of the new
    # batch is 2 (not 10): three rows of width 2 cost 6
    items = [item(0, 9), item(1, 1), item(2, 1), item(3, 1)]
    assert shape(make_batches(items, 10, None)) == [[0], [1, 2, 3]]
    items = [item(0, 3), item(1, 3), item(2, 2)]
    assert shape(make_batches(items, 8, None)) == [[0, 1], [2]]  # 2 x 4 = 8; 3 x 4 = 12 > 8
    # the first row of a new batch sets its width even when the next row is shorter:
    # lengths 5, 3, 2 and max_tokens 6: [0] (6); [1] (4), + item 2: 2 x 4 = 8 > 6
    items = [item(0, 5), item(1, 3), item(2, 2)]
    assert shape(make_batches(items, 6, None)) == [[0], [1], [2]]
    # lengths 5, 3, 3 and max_tokens 8: [0] (6); [1, 2]: 2 x 4 = 8, exactly the limit
    items = [item(0, 5), item(1, 3), item(2, 3)]
    assert shape(make_batches(items, 8, None)) == [[0], [1, 2]]


def test_items_are_the_callers_objects():
    items = [item(i, n) for i, n in enumerate(LENGTHS)]
    flat = [it for b in make_batches(items, 12, None) for it in b]
    assert all(any(it is x for x in items) for it in flat)


# --------------------------------------------------------------------------------------------
# collate_source


def test_collate_source_rows_ids_then_eos_then_pad():
    batch = [Item(7, np.array([5, 6, 7], dtype=np.int64)), Item(2, np.array([9], dtype=np.int32)),
             Item(0, np.array([4, 4], dtype=np.int64))]
    got = collate_source([it.ids for it in batch], eos=2, pad=0)
    assert got.dtype == torch.int64
    assert got.tolist() == [[5, 6, 7, 2], [9, 2, 0, 0], [4, 4, 2, 0]]
    # other ids for </s> and <pad> are used as given
    assert collate_source([it.ids for it in batch[1:]], eos=11, pad=13).tolist() == [[9, 11, 13], [4, 4, 11]]
    # a single row has no padding; an empty row is </s> alone
    assert collate_source([np.zeros(0, dtype=np.int64)], eos=2, pad=0).tolist() == [[2]]


# --------------------------------------------------------------------------------------------
# chunks (--buffer-size)


@pytest.mark.parametrize("n,size,want", [
    (7, 3, [3, 3, 1]),
    (6, 3, [3, 3]),
    (6, 6, [6]),
    (5, 6, [5]),
    (3, 1, [1, 1, 1]),
    (0, 4, []),
])
def test_chunks_sizes_by_hand_and_order_kept(n, size, want):
    items = [item(i, 1) for i in range(n)]
    got = list(chunks(iter(items), size))
    assert [len(c) for c in got] == want
    assert [it.index for c in got for it in c] == list(range(n))


def test_chunks_are_served_lazily():
    """A chunk is handed out before the next input is read (endless stdin, interactive use)."""
    read = []

    def source():
        for i in range(10):
            read.append(i)
            yield item(i, 1)

    it = chunks(source(), 2)
    first = next(it)
    assert [x.index for x in first] == [0, 1] and read == [0, 1]
    second = next(it)
    assert [x.index for x in second] == [2, 3]
    assert first != second and [x.index for x in first] == [0, 1]  # a new list, not the old one refilled


# --------------------------------------------------------------------------------------------
# Truncations


def test_truncation_limit_is_inclusive_and_the_warning_names_the_input():
    warned = []
    tr = Truncations(warned.append, lambda i: f"in.de:{i + 1}", "in.de", 4)
    ids = np.arange(10, 14)
    assert tr(0, ids) is ids and tr.count == 0 and warned == []  # 4 tokens: kept as they are
    got = tr(6, np.arange(10, 16))
    assert got.tolist() == [10, 11, 12, 13] and tr.count == 1
    assert warned == ["in.de:7: 6 tokens, truncated to 4 (the model accepts 5 source positions including </s>)"]
    tr.summary()
    assert len(warned) == 1  # no summary at or below MAX_WARNINGS


def test_truncation_names_the_first_max_warnings_then_counts():
    warned = []
    tr = Truncations(warned.append, lambda i: f"line {i}", "split 'test'", 1)
    for i in range(MAX_WARNINGS):
        assert tr(i, np.array([5, 6])).tolist() == [5]
    assert len(warned) == MAX_WARNINGS and warned[-1].startswith(f"line {MAX_WARNINGS - 1}: 2 tokens")
    tr.summary()
    assert len(warned) == MAX_WARNINGS  # exactly MAX_WARNINGS: all named, no summary
    tr(MAX_WARNINGS, np.array([5, 6, 7]))
    assert len(warned) == MAX_WARNINGS and tr.count == MAX_WARNINGS + 1
    tr.summary()
    assert warned[-1] == f"split 'test': {MAX_WARNINGS + 1} inputs in all were truncated ({MAX_WARNINGS} named above)"


# --------------------------------------------------------------------------------------------
# Translator.translate_items


def on_device(model, device: str, search_cfg: SearchConfig, d) -> Translator:
    """A Translator over `model` (moved to `device`), without a data directory."""
    from nmtkit.backends.registry import ModelSource
    from nmtkit.models.loading import LoadedModels

    loaded = LoadedModels([model.to(device)], max_source_tokens=15, max_target_tokens=15)
    engine = TorchEngine(loaded, torch.device(device), d, d)
    source = ModelSource("checkpoint", TorchEngine, ("model.pt",), "unused", {"source_lang": "de", "target_lang": "en"})
    return Translator(engine, source, src_dict=d, tgt_dict=d, tgt_subword=None, search=search_cfg)


@pytest.fixture(scope="module")
def tiny():
    """A Translator over a random Transformer (12 target symbols), without a data directory."""
    from nmtkit.data.dictionary import Dictionary
    from nmtkit.models import ArchConfig, Transformer

    d = Dictionary()
    for w in "abcdefgh":
        d.add_symbol(w)
    torch.manual_seed(3)
    cfg = ArchConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2,
                     max_source_positions=16, max_target_positions=16)
    model = Transformer(cfg, len(d), len(d)).eval()
    with torch.no_grad():  # peaked, source-dependent outputs
        model.tgt_embed.weight.mul_(3.0)
    return on_device(model, "cpu", SearchConfig(beam=3, nbest=2, max_len_b=5), d), model


SOURCES = [[4, 5, 6, 7, 8], [9], [], [10, 11, 4], [6, 6, 6, 6, 6, 6, 6], [7, 8], [5, 9, 10]]


def alone(model, ids: list[int], cfg: SearchConfig) -> list:
    """One sentence searched alone: no padding, no other row."""
    return search([model], torch.tensor([ids + [2]]), cfg)[0]


def same(got, want) -> bool:
    """The same hypotheses: equal tokens, scores equal up to float32 rounding (a padded row sums
    its attention over a longer, masked, row)."""
    return [h.tokens for h in got] == [h.tokens for h in want] and all(
        g.score == pytest.approx(w.score, abs=1e-4) and g.logprob == pytest.approx(w.logprob, abs=1e-4)
        for g, w in zip(got, want))


@pytest.mark.parametrize("max_tokens,batch_size,sizes", [
    (None, None, [6]),  # the default: DEFAULT_BATCH_SIZE sentences
    (None, 1, [1, 1, 1, 1, 1, 1]),
    (None, 4, [4, 2]),
    # sorted lengths 7, 5, 3, 3, 2, 1 (widths 8, 6, 4, 4, 3, 2): 8 + 8 > 12; 6 + 6 = 12, + 6 > 12;
    # 3 x 4 = 12
    (12, None, [1, 2, 3]),
    (100, 2, [2, 2, 2]),
])
def test_translate_items_batched_equals_one_at_a_time(tiny, max_tokens, batch_size, sizes):
    tr, model = tiny
    tr.max_tokens = max_tokens
    tr.batch_size = DEFAULT_BATCH_SIZE if batch_size is None and max_tokens is None else batch_size
    items = [Item(i, np.array(s, dtype=np.int64)) for i, s in enumerate(SOURCES)]
    seen = []
    got = tr.translate_items(items, on_batch=seen.append)
    assert seen == sizes and sum(seen) == 6
    assert sorted(got) == [0, 1, 3, 4, 5, 6]  # no entry for the empty sentence
    cfg = tr.search_config()
    assert cfg.max_len_cap == 15 and (cfg.pad, cfg.eos) == (0, 2)
    for i, s in enumerate(SOURCES):
        if s:
            assert same(got[i], alone(model, s, cfg)), i
            assert len(got[i]) == 2
    assert any(got[i][0].tokens for i in got)  # guard: the model does output tokens
    assert len({tuple(got[i][0].tokens) for i in got}) > 1  # guard: and they depend on the source


def test_translate_items_per_call_settings_and_on_batch_optional(tiny):
    tr, model = tiny
    tr.max_tokens, tr.batch_size = None, 2
    items = [Item(i, np.array(s, dtype=np.int64)) for i, s in enumerate(SOURCES)]
    got = tr.translate_items(items, beam=1, nbest=1, max_len_b=2)
    cfg = tr.search_config(beam=1, nbest=1, max_len_b=2)
    for i, s in enumerate(SOURCES):
        if s:
            assert same(got[i], alone(model, s, cfg))
            assert len(got[i]) == 1 and len(got[i][0].tokens) <= len(s) + 2
    assert tr.search.beam == 3  # the load-time settings are unchanged


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_translate_items_on_cuda_batched_equals_one_at_a_time(tiny):
    """The batch goes to the translator's device (the model's): on a GPU, batched results equal
    each sentence searched alone there."""
    import copy

    tr, model = tiny
    gpu = copy.deepcopy(model).cuda()
    tg = on_device(gpu, "cuda", tr.search, tr.src_dict)
    tg.batch_size = 3
    items = [Item(i, np.array(s, dtype=np.int64)) for i, s in enumerate(SOURCES)]
    got = tg.translate_items(items)
    cfg = tg.search_config()
    for i, s in enumerate(SOURCES):
        if s:
            want = search([gpu], torch.tensor([s + [2]], device="cuda"), cfg)[0]
            assert same(got[i], want), i
