"""The self-attention cache keeps little spare room after a beam reordering (memory at large
batches) and still returns exactly what was appended, in the reordered rows."""

from __future__ import annotations

import torch

from nmtkit.models.attention import KVCache


def test_reordered_cache_holds_what_was_appended_with_little_spare_room():
    torch.manual_seed(0)
    cache = KVCache()
    ks, vs = [], []
    for step in range(40):
        k, v = torch.randn(6, 2, 1, 4), torch.randn(6, 2, 1, 3)
        ks.append(k), vs.append(v)
        k_all, v_all = cache.append(k, v)
        assert k_all.shape == (6, 2, step + 1, 4)
        order = torch.randperm(6)
        cache.index_select(order)
        # the reference: every appended step, its rows in the new order
        assert cache.length == step + 1
        assert cache.k.size(2) == cache.length + KVCache.SLACK
        ks = [x[order] for x in ks]
        vs = [x[order] for x in vs]
        assert torch.equal(cache.k[:, :, : cache.length], torch.cat(ks, dim=2))
        assert torch.equal(cache.v[:, :, : cache.length], torch.cat(vs, dim=2))


def test_a_capacity_given_up_front_is_kept():
    cache = KVCache(capacity=50)
    cache.append(torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4))
    cache.index_select(torch.tensor([2, 0]))
    assert cache.k.size(2) == 50 and cache.k.size(0) == 2


def test_after_a_reorder_the_next_append_fits_without_growing():
    """Beam search reorders after every step: the reordered buffer has room for exactly the next
    position (SLACK 1), so appending writes into it and never reallocates."""
    assert KVCache.SLACK == 1
    cache = KVCache()
    for step in range(20):
        cache.append(torch.randn(4, 2, 1, 8), torch.randn(4, 2, 1, 8))
        cache.index_select(torch.tensor([3, 1, 1, 0]))
        assert cache.k.size(2) == cache.length + 1
        ptr = cache.k.data_ptr()
        k_all, _ = cache.append(torch.randn(4, 2, 1, 8), torch.randn(4, 2, 1, 8))
        assert cache.k.data_ptr() == ptr and k_all.is_contiguous()  # the whole buffer, no spare room
        cache.index_select(torch.arange(4))


def test_without_reorders_the_buffer_grows_by_doubling():
    """Greedy search and sampling reorder only when a sentence finishes: in between, the buffer
    doubles when full (16, 32, 64 positions), never copying more than it holds."""
    cache = KVCache()
    caps = []
    for _ in range(40):
        cache.append(torch.randn(2, 1, 1, 4), torch.randn(2, 1, 1, 4))
        caps.append(cache.k.size(2))
    assert sorted(set(caps)) == [16, 32, 64]
    cache.index_select(torch.tensor([1]))  # a sentence finished: one spare position
    assert cache.k.size(2) == 41
