from __future__ import annotations

import pytest

from campaigns.runs.batching import batch_policy, plan_batches
from campaigns.specs.processors import all_specs

PENDING = [(1, 50), (2, 3), (3, 200), (4, 4), (5, 60), (6, 5), (7, 210)]


def test_original_order_keeps_import_order():
    params = {"batch_policy": "original", "batch_size": 3}
    assert list(plan_batches(PENDING, params)) == [[1, 2, 3], [4, 5, 6], [7]]


def test_length_grouped_puts_similar_lengths_together():
    params = {"batch_policy": "length_grouped", "batch_size": 3}
    assert list(plan_batches(PENDING, params)) == [[2, 4, 6], [1, 5, 3], [7]]


def test_token_budget_keeps_count_times_longest_under_the_budget():
    params = {"batch_policy": "token_budget", "batch_size": 3, "token_budget": 200}
    batches = list(plan_batches(PENDING, params))
    cost = dict(PENDING)
    assert sorted(pk for b in batches for pk in b) == sorted(cost)
    for batch in batches:
        if len(batch) > 1:
            assert len(batch) * max(cost[pk] for pk in batch) <= 200
    # short texts travel together, a text over the budget travels alone
    assert batches[0] == [2, 4, 6, 1]
    assert [7] in batches


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown batch policy"):
        list(plan_batches(PENDING, {"batch_policy": "random"}))


def test_batch_policy_is_the_spec_default_unless_given():
    # Every spec that declares batch_policy fills its default into the cleaned
    # params (what version_create stores); one that declares none plans in import order.
    for spec in all_specs().values():
        declared = spec.params.get("batch_policy")
        if spec.training or any(p.required for p in spec.params.values()):
            continue
        expected = declared.default if declared else "original"
        assert batch_policy(spec.clean({})) == expected, spec.name
    assert batch_policy({}) == "original"
    assert batch_policy({"batch_policy": "token_budget"}) == "token_budget"


def test_a_window_keeps_each_batch_within_one_stretch_of_ids():
    # ids 1-7 and 101-107: two stretches of 100 ids, each sorted by cost alone
    pending = PENDING + [(pk + 100, cost) for pk, cost in PENDING]
    params = {"batch_policy": "length_grouped", "batch_size": 3}
    batches = list(plan_batches(pending, params, window=100))
    assert batches == [[2, 4, 6], [1, 5, 3], [7], [102, 104, 106], [101, 105, 103], [107]]
    budget = {"batch_policy": "token_budget", "token_budget": 200}
    for batch in plan_batches(pending, budget, window=100):
        assert len({pk // 100 for pk in batch}) == 1
    # without a window the two stretches mix (the plan a folder campaign keeps)
    assert [2, 102, 4] in list(plan_batches(pending, params))
