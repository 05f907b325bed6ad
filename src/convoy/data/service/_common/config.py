"""The data service's shared configuration values: the sharding policy and the tables of
supported options (target workers, compressions).

A sharding policy (``processing_mode``) is a :class:`ShardingPolicy` everywhere in the service;
this module is the one place it is made from the user's argument (:func:`sharding_policy`)
and turned into its name for the wire and the journal and back (:func:`policy_name`,
:func:`policy_from_name`).
"""

from __future__ import annotations

import enum
from typing import Any

from convoy._values.codec import COMPRESSIONS
from convoy.errors import InvalidArgumentError


class ShardingPolicy(enum.IntEnum):
    """How a job's input is divided among workers (the values are TensorFlow's)."""

    OFF = 0  #: every worker produces the whole dataset
    DYNAMIC = 1  #: the dispatcher hands out splits of the source; each element once in all
    FILE = 2  #: static: worker i reads the i-th share of the files
    DATA = 3  #: static: worker i keeps every element whose index is i modulo the workers
    FILE_OR_DATA = 4  #: static: FILE when the source is a file list, else DATA
    HINT = 5  #: static: shard(SHARD_HINT, SHARD_HINT) becomes shard(workers, worker index)


_MODE_NAMES = {"parallel_epochs": ShardingPolicy.OFF,
               "distributed_epoch": ShardingPolicy.DYNAMIC}

#: Which workers a trainer reads from (TensorFlow's values).
TARGET_WORKERS = ("AUTO", "ANY", "LOCAL")

#: The values of the wire's string enums: "" (first) is AUTO for target_workers and no
#: compression for compressions.
WIRE_TARGET_WORKERS = ("", *TARGET_WORKERS)
WIRE_COMPRESSIONS = ("", *COMPRESSIONS)


def policy_name(policy: ShardingPolicy) -> str:
    """How the wire, the journal and messages name ``policy`` ("DYNAMIC")."""
    return policy.name


def policy_from_name(name: str) -> ShardingPolicy:
    """The policy a wire message or journal record names; InvalidArgumentError if it names
    none."""
    policy = ShardingPolicy.__members__.get(name)
    if policy is None:
        raise InvalidArgumentError(f"unknown processing mode {name!r}; expected one of "
                                   f"{list(ShardingPolicy.__members__)}")
    return policy


def sharding_policy(value: Any) -> ShardingPolicy:
    """A ShardingPolicy from the enum, its name or TensorFlow's two processing-mode strings."""
    if isinstance(value, ShardingPolicy):
        return value
    if isinstance(value, str):
        if value in _MODE_NAMES:
            return _MODE_NAMES[value]
        if value.upper() in ShardingPolicy.__members__:
            return ShardingPolicy[value.upper()]
    raise InvalidArgumentError(
        "processing_mode should be a convoy.data.service.ShardingPolicy, \"parallel_epochs\" "
        f"or \"distributed_epoch\". Got {value!r}."
    )
