"""What an out-of-memory message says, and the advice it gets (campaigns/runs/memory_errors.py)."""

from __future__ import annotations

from campaigns.runs.memory_errors import (
    ProfileBatch,
    advise,
    batch_sizes_tried,
    parse_message,
    splits_text,
)

GIB, MIB = 1 << 30, 1 << 20
TEXT = {"max_tokens": 512, "dtype": "float32", "batch_size": 64, "batch_policy": "length_grouped"}


def _keys(facts: dict, params: dict = TEXT, profile: ProfileBatch | None = None) -> list[str]:
    return [a.key for a in advise(facts, params=params, profile=profile, cost=None)]


def test_todays_cuda_message_gives_allocated_reserved_free_and_total():
    text = (
        "CUDA out of memory. Tried to allocate 1.25 GiB. GPU 1 has a total capacity of 93.02 GiB "
        "of which 1.18 GiB is free. Process 2752205 has 91.82 GiB memory in use. Of the "
        "allocated memory 90.63 GiB is allocated by PyTorch, and 120.54 MiB is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    )
    figures = parse_message(text)
    assert figures == {
        "requested": int(1.25 * GIB),
        "total": int(93.02 * GIB),
        "free": int(1.18 * GIB),
        "allocated": int(90.63 * GIB),
        "reserved": int(90.63 * GIB) + int(120.54 * MIB),
    }


def test_the_older_cuda_message_is_read_too():
    text = (
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
        "14.56 GiB already allocated; 3.44 MiB free; 7.89 GiB allowed; 14.58 GiB reserved in "
        "total by PyTorch)"
    )
    assert parse_message(text) == {
        "requested": 20 * MIB,
        "total": int(15.78 * GIB),
        "free": int(3.44 * MIB),
        "allowed": int(7.89 * GIB),
        "allocated": int(14.56 * GIB),
        "reserved": int(14.58 * GIB),
    }


def test_a_message_without_figures_gives_none():
    assert parse_message("CUDA out of memory (simulated)") == {}


def test_the_sizes_a_split_batch_ran_at_come_from_the_sizes_it_halved():
    assert batch_sizes_tried([64, 32, 16, 32]) == [64, 32, 16, 8]
    assert batch_sizes_tried([5, 3]) == [5, 3, 2, 1]
    assert batch_sizes_tried([], alone=1) == [1]
    assert batch_sizes_tried(None) == []
    assert splits_text([8, 4, 4, 2], 1, sep=">") == "8>4>2>1 (1 failed alone)"
    assert splits_text([], 0) == ""


def test_a_larger_card_only_for_a_unit_that_failed_alone_at_batch_1_and_last():
    alone = {"tried": [64, 32, 16, 8, 4, 2, 1], "alone": True}
    assert _keys(alone) == [
        "profile-batch",
        "max-tokens",
        "half-precision",
        "expandable-segments",
        "larger-card",
    ]
    # a split batch's failure, a failure outside the split, an old attempt: no card
    assert "larger-card" not in _keys({"tried": [64, 32], "alone": False})
    assert "larger-card" not in _keys({"tried": [], "alone": False})
    assert "larger-card" not in _keys({})


def test_the_profiles_batch_comes_first_where_it_is_smaller_than_the_batch_that_failed():
    profile = ProfileBatch(pk=3, batch_size=16, device="NVIDIA L4")
    advice = advise(
        {"tried": [64, 32, 16, 8, 4, 2, 1], "alone": True},
        params=TEXT,
        profile=profile,
        cost=None,
    )
    assert advice[0].key == "profile-batch"
    assert "batch_size 16 (profile 3, on NVIDIA L4) instead of 64" in advice[0].text
    # a batch already at the profile's size: the profile has nothing to add
    assert "profile-batch" not in _keys({"tried": [16, 8, 4, 2, 1], "alone": True}, TEXT, profile)


def test_under_a_token_budget_the_profiles_batch_is_given_as_a_token_budget():
    # batch_size plans nothing under token_budget (the text default): the
    # profile's batch of texts at max_tokens is given as the budget it fills.
    params = {**TEXT, "batch_policy": "token_budget", "token_budget": 65536}
    profile = ProfileBatch(pk=3, batch_size=16, device="NVIDIA L4")
    advice = advise({"tried": [128, 64, 32]}, params=params, profile=profile, cost=None)
    assert advice[0].key == "profile-batch"
    assert "token_budget 8192 (16 texts of 512 tokens" in advice[0].text
    assert "profile 3, on NVIDIA L4" in advice[0].text
    assert "batch_size" not in advice[0].text


def test_a_profile_s_budget_above_the_one_that_ran_out_is_not_advised():
    # 128 short texts ran out under the default budget of 4,096: the profile's
    # 16 texts of 512 tokens (8,192) would raise the budget, not lower it.
    params = {**TEXT, "batch_policy": "token_budget", "token_budget": 4096}
    profile = ProfileBatch(pk=3, batch_size=16, device="NVIDIA L4")
    advice = advise({"tried": [128, 64, 32]}, params=params, profile=profile, cost=None)
    assert "profile-batch" not in [a.key for a in advice]
    assert not any("token_budget 8192" in a.text for a in advice)


def test_advice_that_does_not_apply_is_left_out():
    facts = {
        "tried": [1],
        "alone": True,
        "alloc_conf": "expandable_segments:True",
        "workers_per_device": 1,
    }
    image = {"batch_size": 32, "dtype": "bfloat16", "batch_policy": "original"}
    # batch 1, half precision already, expandable segments set, one process: a card
    assert _keys(facts, image) == ["larger-card"]


def test_a_token_budget_and_other_processes_on_the_device_are_named():
    params = {**TEXT, "batch_policy": "token_budget", "token_budget": 8192}
    facts = {
        "tried": [12, 6],
        "total": 80 * GIB,
        "free": 1 * GIB,
        "in_use": 40 * GIB,
        "workers_per_device": 1,
    }
    advice = advise(facts, params=params, profile=None, cost=300)
    keys = [a.key for a in advice]
    assert keys == [
        "profile-batch",
        "max-tokens",
        "token-budget",
        "half-precision",
        "expandable-segments",
        "fewer-processes",
    ]
    assert "Lower token_budget (now 8192)" in advice[2].text
    assert "other processes held 39.00 GiB" in advice[5].text
    assert "this unit reaches the cap" not in advice[1].text
    assert "this unit has 300 tokens" in advice[1].text
