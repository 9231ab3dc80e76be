"""Learning-rate schedules against hand-computed values of their formulas."""

from __future__ import annotations

import pytest

from nmtkit.training.schedule import Schedule

# noam, warmup 4000: lr = d^-0.5 * min(u^-0.5, u * 4000^-1.5); 4000^-1.5 = 1/252982.2128134703,
# 4000^-0.5 = 0.015811388300841896, 100000^-0.5 = 0.0031622776601683794.
#   d=512  (512^-0.5 = 0.044194173824159216):
#     u=1      0.044194173824159216 / 252982.2128134703        = 1.7469281074217108e-07
#     u=4000   0.044194173824159216 * 0.015811388300841896     = 6.987712429686843e-04
#     u=100000 0.044194173824159216 * 0.0031622776601683794    = 1.3975424859373686e-04
#   d=1024 (1024^-0.5 = 0.03125):
#     u=1      0.03125 / 252982.2128134703                     = 1.2352647110032732e-07
#     u=4000   0.03125 * 0.015811388300841896                  = 4.941058844013093e-04
#     u=100000 0.03125 * 0.0031622776601683794                 = 9.882117688026186e-05
NOAM = {
    (512, 1): 1.7469281074217108e-07,
    (512, 4000): 6.987712429686843e-04,
    (512, 100000): 1.3975424859373686e-04,
    (1024, 1): 1.2352647110032732e-07,
    (1024, 4000): 4.941058844013093e-04,
    (1024, 100000): 9.882117688026186e-05,
}


@pytest.mark.parametrize("d_model,update", sorted(NOAM))
def test_noam_matches_paper_formula(d_model, update):
    s = Schedule("noam", warmup=4000, d_model=d_model)
    assert s.lr(update) == pytest.approx(NOAM[(d_model, update)], rel=1e-12)


def test_noam_scale_and_peak():
    s = Schedule("noam", warmup=4000, d_model=512, lr_scale=2.0)
    assert s.lr(4000) == pytest.approx(2 * 6.987712429686843e-04, rel=1e-12)
    assert s.lr(3999) < s.lr(4000) > s.lr(4001)


def test_inverse_sqrt_fairseq_shape():
    # peak 7e-4, warmup 1000, from 0: u=1 -> 7e-7; u=500 -> 3.5e-4; u=1000 -> 7e-4; u=4000 -> 7e-4*sqrt(1/4)
    s = Schedule("inverse_sqrt", warmup=1000, peak_lr=7e-4)
    assert s.lr(1) == pytest.approx(7e-7)
    assert s.lr(500) == pytest.approx(3.5e-4)
    assert s.lr(1000) == pytest.approx(7e-4)
    assert s.lr(4000) == pytest.approx(3.5e-4)
    s2 = Schedule("inverse_sqrt", warmup=10, peak_lr=1e-3, warmup_init_lr=1e-4)
    assert s2.lr(5) == pytest.approx(1e-4 + 0.5 * 9e-4)


def test_rejects_bad_settings():
    with pytest.raises(ValueError, match="warmup"):
        Schedule("inverse_sqrt", warmup=0)
    with pytest.raises(ValueError, match="unknown"):
        Schedule("cosine", warmup=10)


def test_warmup_of_one_update_is_allowed():
    # warmup 1 is the smallest valid setting: noam starts at its peak d^-0.5 and decays as u^-0.5
    s = Schedule("noam", warmup=1, d_model=64)
    assert s.lr(1) == pytest.approx(0.125, rel=1e-12)  # 64^-0.5
    assert s.lr(4) == pytest.approx(0.0625, rel=1e-12)  # 64^-0.5 * 4^-0.5
    i = Schedule("inverse_sqrt", warmup=1, peak_lr=1e-3)
    assert i.lr(1) == pytest.approx(1e-3) and i.lr(4) == pytest.approx(5e-4)


def test_inverse_sqrt_on_both_sides_of_the_warmup_edge():
    # warmup 100, peak 1e-3, from 1e-4: u=99 -> 1e-4 + 9e-4 * 0.99 = 9.91e-4; u=100 -> 1e-3;
    # u=101 -> 1e-3 * sqrt(100/101) = 9.950371902099892e-04; u=0 is treated as u=1 -> 1.09e-4
    s = Schedule("inverse_sqrt", warmup=100, peak_lr=1e-3, warmup_init_lr=1e-4)
    assert s.lr(99) == pytest.approx(9.91e-4, rel=1e-12)
    assert s.lr(100) == pytest.approx(1e-3, rel=1e-12)
    assert s.lr(101) == pytest.approx(9.950371902099892e-04, rel=1e-12)
    assert s.lr(0) == s.lr(1) == pytest.approx(1.09e-4, rel=1e-12)


def test_state_dict_names_every_setting_and_round_trips():
    s = Schedule("inverse_sqrt", warmup=7, d_model=256, lr_scale=3.0, peak_lr=2e-3, warmup_init_lr=1e-5)
    assert s.state_dict() == {"name": "inverse_sqrt", "warmup": 7, "d_model": 256, "lr_scale": 3.0,
                              "peak_lr": 2e-3, "warmup_init_lr": 1e-5, "start": 0}
    assert Schedule(**s.state_dict()) == s


def test_start_restarts_the_schedule_at_a_later_update():
    # a reset at update 1000: update 1000 + u runs at the rate of update u of a fresh schedule
    fresh = Schedule("inverse_sqrt", warmup=10, peak_lr=1e-3)
    later = Schedule("inverse_sqrt", warmup=10, peak_lr=1e-3, start=1000)
    assert [later.lr(1000 + u) for u in (1, 5, 10, 40)] == [1e-4, 5e-4, 1e-3, 5e-4]
    assert [later.lr(1000 + u) for u in (1, 5, 10, 40)] == [fresh.lr(u) for u in (1, 5, 10, 40)]
    assert Schedule(**later.state_dict()) == later
