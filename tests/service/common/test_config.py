"""The sharding policy's one conversion: from the user's argument, to its wire and journal
name and back."""

from __future__ import annotations

import pytest

from convoy.data.service import ShardingPolicy
from convoy.data.service._common.config import policy_from_name, policy_name, sharding_policy
from convoy.errors import InvalidArgumentError


@pytest.mark.parametrize("policy", list(ShardingPolicy))
def test_a_policy_named_for_the_wire_reads_back_as_itself(policy: ShardingPolicy) -> None:
    assert policy_name(policy) == policy.name  # what journals hold: never to change
    assert policy_from_name(policy_name(policy)) is policy


@pytest.mark.parametrize(("value", "policy"), [
    (ShardingPolicy.HINT, ShardingPolicy.HINT), ("parallel_epochs", ShardingPolicy.OFF),
    ("distributed_epoch", ShardingPolicy.DYNAMIC), ("file_or_data", ShardingPolicy.FILE_OR_DATA),
])
def test_the_users_argument(value: object, policy: ShardingPolicy) -> None:
    assert sharding_policy(value) is policy


@pytest.mark.parametrize("name", ["", "dynamic", "1", "BOGUS"])
def test_a_wire_name_is_exact(name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"unknown processing mode {name!r}"):
        policy_from_name(name)


@pytest.mark.parametrize("value", [1, None, "epochs", b"OFF"])
def test_an_argument_that_names_no_policy(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="processing_mode should be"):
        sharding_policy(value)
