"""Strategy parsing and picking, checked statistically with a seeded RNG."""

import random

import pytest

from services.toposm.strategy import IMPORTANT, MISSING, StrategyError, choose_for_mix, choose_source, parse_strategy


def test_parse_mix():
    mix = parse_strategy("missing:2, by_work_available:6")
    assert mix.parts == (("missing", 2), ("by_work_available", 6))
    assert str(mix) == "missing:2,by_work_available:6"
    assert str(parse_strategy("by_zoom")) == "by_zoom"


@pytest.mark.parametrize(
    "text", ["", "fastest", "missing:0", "missing:-1", "missing:x", "missing,missing", "by_zoom:1.5"]
)
def test_parse_rejects(text):
    with pytest.raises(StrategyError):
        parse_strategy(text)


def test_missing_then_important_first():
    rng = random.Random(1)
    for name in ("missing", "important", "by_work_available", "by_zoom"):
        assert choose_source(name, 3, 5, {10: 100}, rng) == MISSING
    assert choose_source("missing", 0, 5, {10: 100}, rng) is None
    assert choose_source("important", 0, 5, {10: 100}, rng) == IMPORTANT
    assert choose_source("important", 0, 0, {10: 100}, rng) is None
    assert choose_source("by_work_available", 0, 5, {10: 100}, rng) == IMPORTANT
    assert choose_source("by_zoom", 0, 0, {10: 100}, rng) == 10
    assert choose_source("by_zoom", 0, 0, {}, rng) is None


def _draws(strategy, queues, n=20000, seed=7):
    rng = random.Random(seed)
    counts = {}
    for _ in range(n):
        source = choose_source(strategy, 0, 0, queues, rng)
        counts[source] = counts.get(source, 0) + 1
    return {k: v / n for k, v in counts.items()}


def test_by_work_available_weights_by_queue_length():
    shares = _draws("by_work_available", {10: 300, 12: 100, 14: 600})
    assert shares[10] == pytest.approx(0.3, abs=0.015)
    assert shares[12] == pytest.approx(0.1, abs=0.015)
    assert shares[14] == pytest.approx(0.6, abs=0.015)


def test_by_zoom_weights_by_tiles_per_zoom():
    # 4^12 : 4^13 = 1 : 4, whatever the queue lengths
    shares = _draws("by_zoom", {12: 1000, 13: 1})
    assert shares[13] == pytest.approx(0.8, abs=0.015)
    assert shares[12] == pytest.approx(0.2, abs=0.015)


def test_mix_draws_by_weight_and_falls_back():
    mix = parse_strategy("important:1,by_zoom:3")
    rng = random.Random(3)
    picks = [choose_for_mix(mix, 0, 10, {5: 10}, rng) for _ in range(20000)]
    # by_zoom also takes important first, so important always wins while it has work
    assert set(picks) == {IMPORTANT}
    # no important work: `important` finds nothing and the mix falls back to by_zoom
    assert choose_for_mix(mix, 0, 0, {5: 10}, rng) == 5
    only_missing = parse_strategy("missing")
    assert choose_for_mix(only_missing, 0, 10, {5: 10}, rng) is None


def test_mix_order_is_weighted_and_reproducible():
    mix = parse_strategy("missing:2,by_work_available:6")
    rng = random.Random(11)
    firsts = [mix.draw_order(rng)[0] for _ in range(20000)]
    assert firsts.count("missing") / 20000 == pytest.approx(0.25, abs=0.015)
    a = [mix.draw_order(random.Random(5)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
