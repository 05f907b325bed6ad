"""Scenarios of TensorFlow's ``tensorflow/python/checkpoint/checkpoint_management_test.py``,
ported, and TensorFlow's checkpoint numbering and restart recipe on real parameter servers.

Each ported test names the TensorFlow test it comes from. TensorFlow's checkpoint paths are
prefixes (``ckpt-1``, with ``.index`` and ``.data`` files beside them); convoy's are the one
file ``ckpt-1.safetensors``, and ``restore`` takes either form.

Scenarios that cannot apply, and why:

- ``LatestCheckpointWithRelativePaths.testNameCollision``: TF1 ``Saver`` files can collide
  with the state file named ``checkpoint``; convoy's files end in ``.safetensors`` and the
  state file is ``checkpoint.json``, so no prefix collides with it.
- ``CheckpointStateTest`` (``generate_checkpoint_state_proto``, ``update_checkpoint_state``,
  ``get_checkpoint_state``) and ``SaverUtilsTest`` (``checkpoint_exists``,
  ``get_checkpoint_mtimes``, ``remove_checkpoint``): TF1 state-proto and Saver utilities
  without a convoy counterpart (a checkpoint is one file: ``os.path.exists`` tells). What
  they establish for ``latest_checkpoint`` is ported: names relative to the directory, and an
  unreadable state file is an error (DataLossError here, ValueError in TensorFlow).
- ``CheckpointManagerTest.testSaveRestoreState`` and ``testClockReset``
  (``keep_checkpoint_every_n_hours``) and ``testCheckpointInterval*`` (``step_counter``,
  ``checkpoint_interval``): not implemented.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.distribute import ParameterServerStrategy
from convoy.distribute.partitioners import FixedShardsPartitioner
from convoy.errors import DataLossError

pytestmark = pytest.mark.timeout(120)

# Functions defined here run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SUFFIX = ".safetensors"


def exists(path):
    return os.path.exists(path if path.endswith(SUFFIX) else path + SUFFIX)


# ----- LatestCheckpointWithRelativePaths, CheckpointStateTest ---------------------------------

def test_relative_path(tmp_path, monkeypatch):
    # LatestCheckpointWithRelativePaths.testRelativePath
    monkeypatch.chdir(tmp_path)
    os.mkdir("train")
    v0 = cv.Variable(0.0)
    manager = cv.train.CheckpointManager(cv.train.Checkpoint(v0=v0), "train",
                                         checkpoint_name="snapshot")
    for step in range(3):
        manager.save(checkpoint_number=step)
        v0.assign_add(1.0)
    v0 = cv.Variable(-1.0)  # a new program with another initial value
    name = cv.train.latest_checkpoint("train")
    assert name is not None and not os.path.isabs(name)
    cv.train.Checkpoint(v0=v0).restore(name)
    assert float(v0) == 2.0


def test_state_file_names_are_relative_to_the_directory(tmp_path):
    # CheckpointStateTest.testCheckPointCompletesRelativePaths
    (tmp_path / "model.ckpt-687529.safetensors").write_bytes(b"")
    (tmp_path / "checkpoint.json").write_text(json.dumps(
        {"latest": "./model.ckpt-687529.safetensors",
         "all": ["./model.ckpt-687500.safetensors", "./model.ckpt-687529.safetensors"]}))
    assert cv.train.latest_checkpoint(tmp_path) == os.path.join(
        tmp_path, "./model.ckpt-687529.safetensors")
    manager = cv.train.CheckpointManager(cv.train.Checkpoint(), tmp_path)
    assert manager.checkpoints == [os.path.join(tmp_path, "./model.ckpt-687500.safetensors"),
                                   os.path.join(tmp_path, "./model.ckpt-687529.safetensors")]


def test_incomplete_state_file_fails(tmp_path):
    # CheckpointStateTest.testCheckPointStateFailsWhenIncomplete
    (tmp_path / "checkpoint.json").write_text("")
    with pytest.raises(DataLossError, match="checkpoint.json"):
        cv.train.latest_checkpoint(tmp_path)


def test_no_checkpoint_and_a_missing_latest_file(tmp_path):
    # latest_checkpoint returns None with no state file, and when its latest file is gone
    assert cv.train.latest_checkpoint(tmp_path) is None
    path = cv.train.Checkpoint().save(tmp_path / "ckpt")
    assert cv.train.latest_checkpoint(tmp_path) == path
    os.remove(path)
    assert cv.train.latest_checkpoint(tmp_path) is None


# ----- CheckpointManagerTest ----------------------------------------------------------------------

def test_deletion(tmp_path):  # CheckpointManagerTest.testDeletion
    manager = cv.train.CheckpointManager(cv.train.Checkpoint(), tmp_path, max_to_keep=3)
    first, second, third, fourth = (manager.save() for _ in range(4))
    assert [exists(p) for p in (first, second, third, fourth)] == [False, True, True, True]


def test_keep_all(tmp_path):  # CheckpointManagerTest.testKeepAll
    checkpoint = cv.train.Checkpoint()
    manager = cv.train.CheckpointManager(checkpoint, tmp_path, max_to_keep=None)
    first, second, third = (manager.save() for _ in range(3))
    assert all(exists(p) for p in (first, second, third))
    assert manager.latest_checkpoint == third
    assert manager.checkpoints == [first, second, third]
    manager = cv.train.CheckpointManager(checkpoint, tmp_path, max_to_keep=None)
    fourth = manager.save()
    assert manager.checkpoints == [first, second, third, fourth]
    manager = cv.train.CheckpointManager(checkpoint, tmp_path, max_to_keep=3)
    assert manager.checkpoints == [first, second, third, fourth]
    assert all(exists(p) for p in (first, second, third, fourth))
    fifth = manager.save()
    assert manager.checkpoints == [third, fourth, fifth]
    assert [exists(p) for p in (first, second, third, fourth, fifth)] == [
        False, False, True, True, True]


def test_continue_from_unmanaged(tmp_path):  # CheckpointManagerTest.testContinueFromUnmanaged
    prefix = tmp_path / "unusual_prefix"
    checkpoint = cv.train.Checkpoint()
    first, second = checkpoint.save(prefix), checkpoint.save(prefix)
    checkpoint = cv.train.Checkpoint()
    manager = cv.train.CheckpointManager(checkpoint, tmp_path, max_to_keep=2)
    checkpoint.restore(manager.latest_checkpoint)
    assert checkpoint.save_counter == 2
    third = manager.save()
    assert manager.checkpoints == [third]
    fourth = manager.save()
    assert manager.checkpoints == [third, fourth]
    fifth = manager.save()
    assert manager.checkpoints == [fourth, fifth]
    assert [exists(p) for p in (first, second, third, fourth, fifth)] == [
        True, True, False, True, True]


def test_custom_numbering(tmp_path):  # CheckpointManagerTest.testCustomNumbering
    step = cv.Variable(0, dtype=np.int64)
    checkpoint = cv.train.Checkpoint(step=step)
    manager = cv.train.CheckpointManager(checkpoint, tmp_path, max_to_keep=2)
    for i in range(5):
        path = manager.save(checkpoint_number=step)
        assert path.endswith(f"-{2 * i}{SUFFIX}")
        step.assign_add(2)
    assert checkpoint.save_counter == 5
    last_path = manager.save(checkpoint_number=32)
    assert f"-32{SUFFIX}" in last_path
    assert last_path == manager.latest_checkpoint == cv.train.latest_checkpoint(tmp_path)
    assert manager.checkpoints == [path, last_path]  # only the two most recent are kept
    state = json.loads((tmp_path / "checkpoint.json").read_text())
    assert state["all"] == [os.path.basename(path), os.path.basename(last_path)]


def test_custom_checkpoint_prefix(tmp_path):  # CheckpointManagerTest.testCustomCheckpointPrefix
    checkpoint = cv.train.Checkpoint()
    manager = cv.train.CheckpointManager(checkpoint, tmp_path, max_to_keep=2,
                                         checkpoint_name="ckpt_name")
    assert os.path.basename(manager.save(checkpoint_number=5)) == f"ckpt_name-5{SUFFIX}"
    manager = cv.train.CheckpointManager(checkpoint, tmp_path, max_to_keep=2)
    assert os.path.basename(manager.save(checkpoint_number=5)) == f"ckpt-5{SUFFIX}"


def test_restore_or_initialize(tmp_path):  # CheckpointManagerTest.testRestoreOrInitialize
    init_v = cv.Variable(2.0)
    init_path = cv.train.Checkpoint(v=init_v).save(tmp_path / "init")
    v = cv.Variable(1.0)
    checkpoint = cv.train.Checkpoint(v=v)
    manager = cv.train.CheckpointManager(checkpoint, tmp_path / "ckpt", max_to_keep=None,
                                         init_fn=lambda: checkpoint.restore(init_path))
    assert manager.restore_or_initialize() is None  # calls init_fn
    assert float(v) == 2.0
    manager.save()
    assert manager.restore_or_initialize() is not None


def test_checkpoint_manager_fspath_directory(tmp_path):
    # CheckpointManagerTest.testCheckpointManagerFSpathDirectory
    directory = pathlib.Path(tmp_path)
    checkpoint = cv.train.Checkpoint(v=cv.Variable(0.0))
    manager = cv.train.CheckpointManager(checkpoint, directory, max_to_keep=2,
                                         checkpoint_name="ckpt_name")
    assert manager.save() == str(directory / f"ckpt_name-1{SUFFIX}")
    assert manager.restore_or_initialize() == str(directory / f"ckpt_name-1{SUFFIX}")


def test_latest_checkpoint_fspath_directory(tmp_path):
    # CheckpointManagerTest.testLatestCheckpointFSpathDirectory
    directory = pathlib.Path(tmp_path)
    manager = cv.train.CheckpointManager(cv.train.Checkpoint(), directory, max_to_keep=2,
                                         checkpoint_name="ckpt_name")
    manager.save()
    assert cv.train.latest_checkpoint(directory) == str(directory / f"ckpt_name-1{SUFFIX}")


# ----- Checkpoint.save numbering (TensorFlow's Checkpoint.save/write contract) -----------------

def test_save_numbers_and_write_does_not(tmp_path):
    v = cv.Variable(1.0)
    checkpoint = cv.train.Checkpoint(v=v)
    prefix = tmp_path / "run" / "model"
    first = checkpoint.save(prefix)
    v.assign(2.0)
    second = checkpoint.save(prefix)
    assert (first, second) == (f"{prefix}-1{SUFFIX}", f"{prefix}-2{SUFFIX}")
    assert cv.train.latest_checkpoint(tmp_path / "run") == second
    assert checkpoint.write(prefix) == f"{prefix}{SUFFIX}"  # not numbered, not the latest
    assert checkpoint.write(prefix) == f"{prefix}{SUFFIX}"
    assert cv.train.latest_checkpoint(tmp_path / "run") == second
    assert checkpoint.save_counter == 2
    checkpoint.restore(first)  # two saves never overwrite each other
    assert float(v) == 1.0
    checkpoint.restore(second)
    assert float(v) == 2.0


def test_a_restored_checkpoint_continues_numbering(tmp_path):
    prefix = tmp_path / "ckpt"
    checkpoint = cv.train.Checkpoint(v=cv.Variable(0.0))
    for _ in range(3):
        checkpoint.save(prefix)
    restarted = cv.train.Checkpoint(v=cv.Variable(0.0))
    restarted.restore(cv.train.latest_checkpoint(tmp_path))
    assert restarted.save_counter == 3
    assert restarted.save(prefix) == f"{prefix}-4{SUFFIX}"
    # a fresh Checkpoint that was not restored does not overwrite earlier files either
    assert cv.train.Checkpoint().save(prefix) == f"{prefix}-5{SUFFIX}"


# ----- the restart recipe on real parameter servers -------------------------------------------

def test_optimizer_iterations_on_the_ps_counts_and_restores(resolver, tmp_path):
    # TensorFlow's restart recipe: Checkpoint(model, optimizer) in a CheckpointManager,
    # `optimizer.iterations` tells how far training got
    def build():
        strategy = ParameterServerStrategy(resolver(2), FixedShardsPartitioner(2))
        with strategy.scope():
            model = {"w": cv.Variable(np.zeros((4, 2), np.float32), name="w")}
            optimizer = cv.optimizers.SGD(0.5)
        manager = cv.train.CheckpointManager(
            cv.train.Checkpoint(model=model, optimizer=optimizer), tmp_path, max_to_keep=3)
        return model, optimizer, manager

    model, optimizer, manager = build()
    assert optimizer.iterations.device.startswith("/job:ps/")
    assert int(optimizer.iterations) == 0
    paths = []
    for _ in range(3):
        optimizer.apply_gradients([(np.ones((4, 2), np.float32), model["w"])])
        paths.append(manager.save())
    assert int(optimizer.iterations) == 3
    assert [os.path.basename(p) for p in paths] == [f"ckpt-{i}{SUFFIX}" for i in (1, 2, 3)]

    model, optimizer, manager = build()  # a restarted coordinator
    assert int(optimizer.iterations) == 0
    assert manager.restore_or_initialize() == paths[-1]
    assert int(optimizer.iterations) == 3
    np.testing.assert_array_equal(np.asarray(model["w"]), np.full((4, 2), -1.5))
    assert os.path.basename(manager.save()) == f"ckpt-4{SUFFIX}"
    cv.train.Checkpoint(model=model, optimizer=optimizer).restore(paths[1])
    assert int(optimizer.iterations) == 2
    np.testing.assert_array_equal(np.asarray(model["w"]), np.full((4, 2), -1.0))


def test_optimizer_iterations_counts_the_steps_of_scheduled_functions(resolver):
    strategy = ParameterServerStrategy(resolver(2))
    with strategy.scope():
        w = cv.Variable(np.zeros(3, np.float32), name="w")
        optimizer = cv.optimizers.SGD(0.1)
    coordinator = cv.distribute.ClusterCoordinator(strategy)
    try:
        def step():
            optimizer.apply_gradients([(np.ones(3, np.float32), w)])

        for _ in range(20):
            coordinator.schedule(step)
        coordinator.join()
    finally:
        coordinator.shutdown()
    assert int(optimizer.iterations) == 20
    np.testing.assert_allclose(np.asarray(w), np.full(3, -2.0), rtol=1e-6)
