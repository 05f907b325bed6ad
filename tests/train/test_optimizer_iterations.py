"""``optimizer.iterations``: counted by apply_gradients in the same call as the updates,
saved with a checkpoint, and left behind (with a warning) when an optimizer made outside any
strategy scope is sent to workers. The parameter-server cases are in
``tests/distribute/tf_ported/test_checkpoint_management.py``."""

from __future__ import annotations

import logging

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.distribute._operations import kind_of
from convoy.errors import InvalidArgumentError
from convoy.train import optimizers


def test_apply_gradients_counts_iterations():
    w = cv.Variable(np.zeros(2, np.float32))
    optimizer = cv.optimizers.Adam(0.1)
    assert int(optimizer.iterations) == 0
    assert optimizer.iterations.dtype == np.int64 and not optimizer.iterations.trainable
    for _ in range(3):
        optimizer.apply_gradients([(np.ones(2, np.float32), w)])
    optimizer.apply_gradients([(None, w)])  # nothing applied: not counted
    optimizer.apply_gradients([])
    assert int(optimizer.iterations) == 3
    with pytest.raises(InvalidArgumentError):
        optimizer.apply_gradients([(np.ones(2, np.float32), np.ones(2))])  # refused here
    assert int(optimizer.iterations) == 3


def test_the_count_travels_with_the_updates_of_its_store(monkeypatch):
    sent = []
    monkeypatch.setattr(optimizers, "send_updates", sent.extend)
    optimizer = cv.optimizers.SGD(0.1)
    a, b = cv.Variable(np.zeros(2)), cv.Variable(np.zeros(2))
    optimizer.apply_gradients([(np.ones(2), a), (np.ones(2), b)])
    kinds = [[kind_of(operation) for operation in operations] for _, operations in sent]
    assert kinds == [["apply"], ["apply"], ["assign_add"]]  # three local stores
    sent.clear()
    monkeypatch.setattr(optimizer, "iterations", a)  # the counter beside a variable
    optimizer.apply_gradients([(np.ones(2), b), (np.ones(2), a)])
    kinds = [[kind_of(operation) for operation in operations] for _, operations in sent]
    assert kinds == [["apply"], ["apply", "assign_add"]]


def test_checkpoint_saves_and_restores_iterations(tmp_path):
    w = cv.Variable(np.zeros(2, np.float32))
    optimizer = cv.optimizers.SGD(0.1)
    checkpoint = cv.train.Checkpoint(w=w, optimizer=optimizer)
    optimizer.apply_gradients([(np.ones(2, np.float32), w)])
    path = checkpoint.save(tmp_path / "ckpt")
    optimizer.apply_gradients([(np.ones(2, np.float32), w)])
    assert int(optimizer.iterations) == 2
    checkpoint.restore(path)
    assert int(optimizer.iterations) == 1


def test_an_optimizer_made_outside_any_scope_leaves_its_counter_behind(caplog):
    optimizer = cv.optimizers.SGD(0.1)
    with caplog.at_level(logging.WARNING):
        copy = cloudpickle.loads(cloudpickle.dumps(optimizer))
        cloudpickle.dumps(optimizer)
    assert caplog.text.count("inside strategy.scope()") == 1  # warned once
    assert copy.iterations is None and optimizer.iterations is not None
    w = cv.Variable(np.zeros(2))
    copy.apply_gradients([(np.ones(2), w)])  # still applies, counts nothing
    np.testing.assert_allclose(w.numpy(), [-0.1, -0.1])
