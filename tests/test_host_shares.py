"""Admission's host shares: whole GRPO groups per host, floor or ceil of B/H where H does not
divide B (da's 3H/4 and 7H/8 rollout hosts, Table F1), with and without O3 balancing, and the
per-sequence metrics of uneven shares weighted by their sequences."""

import numpy as np
import pytest

from locoexp.placement.multihost import combine_host_metrics
from locoexp.placement.phases import host_shares, split_across_hosts


@pytest.mark.parametrize("prompts, hosts", [(128, 3), (256, 7), (128, 6), (4, 3), (8, 4)])
def test_host_shares_are_floor_or_ceil_and_add_up(prompts, hosts):
    shares = host_shares(prompts, hosts)
    assert sum(shares) == prompts and len(shares) == hosts
    assert set(shares) <= {prompts // hosts, -(-prompts // hosts)}
    assert shares == sorted(shares, reverse=True)  # the first B mod H hosts take one more


@pytest.mark.parametrize("balance", [False, True])
def test_every_prompt_goes_to_exactly_one_host_in_its_share(balance):
    rng = np.random.default_rng(0)
    indices = rng.permutation(1000)[:128]
    lengths = rng.integers(10, 500, size=128)
    split = split_across_hosts(indices, lengths, 3, balance=balance)
    assert [len(s) for s in split] == [43, 43, 42]
    np.testing.assert_array_equal(np.sort(np.concatenate(split)), np.sort(indices))
    if not balance:  # contiguous slices in schedule order
        np.testing.assert_array_equal(np.concatenate(split), indices)


def test_balancing_evens_prompt_length_across_uneven_shares():
    rng = np.random.default_rng(1)
    indices = np.arange(29)
    lengths = rng.integers(1, 2000, size=29)
    length_of = dict(zip(indices.tolist(), lengths.tolist(), strict=True))

    def spread(split):
        loads = [sum(length_of[i] for i in s.tolist()) for s in split]
        return max(loads) - min(loads)

    plain = split_across_hosts(indices, lengths, 7, balance=False)
    balanced = split_across_hosts(indices, lengths, 7, balance=True)
    assert [len(s) for s in balanced] == [5, 4, 4, 4, 4, 4, 4]
    assert spread(balanced) < spread(plain)


def test_per_sequence_means_of_uneven_hosts_are_weighted_by_their_sequences():
    hosts = [
        {"rollout/sequences": 32, "rollout/reward_mean": 1.0, "rollout/tokens_out": 10,
         "rollout/waves": 1, "rollout/completion_tokens_max": 7},
        {"rollout/sequences": 16, "rollout/reward_mean": 0.25, "rollout/tokens_out": 5,
         "rollout/waves": 2, "rollout/completion_tokens_max": 9},
    ]  # fmt: skip
    record = combine_host_metrics(hosts)
    assert record["rollout/reward_mean"] == pytest.approx((32 * 1.0 + 16 * 0.25) / 48)
    assert record["rollout/sequences"] == 48 and record["rollout/tokens_out"] == 15
    assert record["rollout/waves"] == 1.5 and record["rollout/completion_tokens_max"] == 9
