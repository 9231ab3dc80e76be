"""Loading without init or copy (`Transformer.from_state_dict`, `load_checkpoint(mmap=True)`):
the model must be the one a normal build + load_state_dict gives, tied matrices tied."""

from __future__ import annotations

import pytest
import torch

from nmtkit.models import ArchConfig, Transformer


def _cfg(**kw):
    base = dict(encoder_layers=2, decoder_layers=2, d_model=16, d_ff=24, heads=2, dropout=0.0,
                max_source_positions=40, max_target_positions=30)
    return ArchConfig(**{**base, **kw})


@pytest.mark.parametrize("share", ["all", "decoder", "none"])
@pytest.mark.parametrize("learned_pos,normalize_before", [(False, False), (True, True)])
def test_from_state_dict_equals_normal_loading(share, learned_pos, normalize_before):
    cfg = _cfg(share_embeddings=share, learned_pos=learned_pos, normalize_before=normalize_before)
    torch.manual_seed(0)
    ref = Transformer(cfg, 11, 11).eval()
    state = ref.state_dict()
    m = Transformer.from_state_dict(cfg, 11, 11, state).eval()
    # every tensor is the state dict's own (no copy), buffers equal the normal build's
    for name, t in m.state_dict().items():
        assert t.data_ptr() == state[name].data_ptr(), name
    assert torch.equal(m.tgt_pos.forward(30), ref.tgt_pos.forward(30))
    assert torch.equal(m.src_pos.forward(40), ref.src_pos.forward(40))
    # tying is by identity, as in a freshly built model
    assert (m.out_proj.weight is m.tgt_embed.weight) == (share != "none")
    assert (m.src_embed is m.tgt_embed) == (share == "all")
    n_params = sum(p.numel() for p in m.parameters())
    assert n_params == sum(p.numel() for p in ref.parameters())
    src = torch.tensor([[4, 5, 6, 2], [7, 2, 0, 0]])
    prev = torch.tensor([[1, 8, 9], [1, 4, 0]])
    with torch.inference_mode():
        assert torch.equal(m(src, prev), ref(src, prev))
    # a cast keeps one copy of a tied matrix
    m.to(torch.bfloat16)
    assert (m.out_proj.weight is m.tgt_embed.weight) == (share != "none")


def test_from_state_dict_refuses_weights_of_another_shape():
    state = Transformer(_cfg(), 11, 11).state_dict()
    with pytest.raises(RuntimeError, match="size mismatch"):
        Transformer.from_state_dict(_cfg(d_ff=32), 11, 11, state)
    del state["decoder_layers.1.ffn.fc2.bias"]
    with pytest.raises(RuntimeError, match="Missing key"):
        Transformer.from_state_dict(_cfg(), 11, 11, state)


def test_load_checkpoint_mmap_equals_read(tmp_path):
    from nmtkit.checkpoints import load_checkpoint, save_checkpoint

    model = Transformer(_cfg(), 11, 11)
    path = tmp_path / "c.pt"
    save_checkpoint({"arch": "x", "arch_config": _cfg().to_dict(), "model": model.state_dict(),
                     "train": {"big": torch.randn(1000)}}, path)
    a, b = load_checkpoint(path), load_checkpoint(path, mmap=True)
    assert a.keys() == b.keys()
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k])
    # a checkpoint in torch's old (non-zip) format cannot be mapped: it is read instead
    old = tmp_path / "old.pt"
    torch.save({"nmtkit_checkpoint": 1, "arch": "x", "arch_config": {}, "model": model.state_dict()}, old,
               _use_new_zipfile_serialization=False)
    c = load_checkpoint(old, mmap=True)
    assert torch.equal(c["model"]["out_proj.weight"], a["model"]["out_proj.weight"])
