"""Options as TensorFlow's ``tf.data.Options``: scenarios ported from TensorFlow's
tensorflow/python/data/kernel_tests/options_test.py, plus what convoy does with each option."""

from __future__ import annotations

import time

import cloudpickle
import pytest

import convoy as cv
from convoy.data import Dataset, Options
from convoy.data.experimental import AutoShardPolicy
from convoy.errors import InvalidArgumentError


def test_options_default() -> None:
    assert Dataset.range(0).options() == Options()


def test_options_once() -> None:
    options = Options()
    assert Dataset.range(0).with_options(options).cache().options() == options


def test_options_twice_different_options() -> None:
    options1 = Options()
    options1.autotune.enabled = True
    options2 = Options()
    options2.experimental_deterministic = False
    options = Dataset.range(0).with_options(options1).with_options(options2).options()
    assert options.autotune.enabled is True
    assert options.experimental_deterministic is False
    assert options.deterministic is False


def test_options_twice_same_option_later_wins() -> None:
    options1, options2 = Options(), Options()
    options1.autotune.enabled = False
    options2.autotune.enabled = True
    ds = Dataset.range(0).with_options(options1).with_options(options2)
    assert ds.options().autotune.enabled is True


def test_options_merge_options_from_multiple_inputs() -> None:
    options1, options2 = Options(), Options()
    options1.autotune.enabled = True
    options2.experimental_deterministic = True
    ds = Dataset.zip((Dataset.range(0).with_options(options1),
                      Dataset.range(0).with_options(options2)))
    assert ds.options().autotune.enabled is True
    assert ds.options().experimental_deterministic is True


def test_options_have_defaults() -> None:
    options1, options2 = Options(), Options()
    assert options1.experimental_optimization is not options2.experimental_optimization
    assert options1.experimental_threading is not options2.experimental_threading
    assert options1.experimental_threading is options1.threading
    assert options1.experimental_optimization == cv.data.experimental.OptimizationOptions()
    assert options1.threading == cv.data.experimental.ThreadingOptions()


def test_mutating_options_raise_value_error() -> None:
    options1, options2 = Options(), Options()
    options1.experimental_slack = True
    options2.autotune.enabled = True
    ds = Dataset.range(0).with_options(options1).map(lambda x: 2 * x).with_options(options2)
    dataset_options = ds.options()
    with pytest.raises(ValueError):
        dataset_options.experimental_deterministic = True
    with pytest.raises(ValueError):
        dataset_options.threading.private_threadpool_size = 2
    options1.deterministic = False  # what was passed to with_options stays the caller's
    assert dataset_options.merge(Options()).experimental_slack is True


def test_every_group_of_tensorflow_is_settable() -> None:
    """The settings of options_test.py's proto round trip that TensorFlow 2.21 still has."""
    options = Options()
    options.experimental_deterministic = True
    options.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA
    options.experimental_distribute.num_devices = 1000
    options.experimental_optimization.apply_default_optimizations = True
    options.experimental_optimization.map_and_batch_fusion = True
    options.experimental_optimization.map_parallelization = True
    options.experimental_optimization.noop_elimination = True
    options.experimental_optimization.parallel_batch = True
    options.experimental_optimization.shuffle_and_repeat_fusion = True
    options.experimental_slack = True
    options.threading.max_intra_op_parallelism = 30
    options.threading.private_threadpool_size = 40
    options.autotune.cpu_budget = 10
    options.autotune.ram_budget = 20
    assert cloudpickle.loads(cloudpickle.dumps(options)) == options
    assert Options().merge(options) == options
    assert options.merge(Options()) == options


def test_setting_a_name_options_does_not_have_raises_attribute_error() -> None:
    options = Options()
    with pytest.raises(AttributeError, match="no_such_option"):
        options.no_such_option = True
    with pytest.raises(AttributeError, match="private_thread_pool"):
        options.threading.private_thread_pool = 2
    with pytest.raises(AttributeError):
        options.no_such_option  # noqa: B018
    with pytest.raises(TypeError):
        Options(no_such_option=True)
    with pytest.raises(TypeError, match="deterministic"):
        options.deterministic = "yes"
    with pytest.raises(InvalidArgumentError, match="auto_shard_policy"):
        options.experimental_distribute.auto_shard_policy = "SOMETIMES"


def test_auto_shard_policy_string_is_an_alias() -> None:
    options = Options(auto_shard_policy="DATA")
    assert options.experimental_distribute.auto_shard_policy is AutoShardPolicy.DATA
    assert options.auto_shard_policy == "DATA"
    options.experimental_distribute.auto_shard_policy = AutoShardPolicy.OFF
    assert options.auto_shard_policy == "OFF"
    assert AutoShardPolicy.OFF == -1 and AutoShardPolicy.HINT == 3  # TensorFlow's values


def slow_first(x: int) -> int:
    """Element 0 takes long: a parallel map that may reorder yields it last."""
    if x == 0:
        time.sleep(0.3)
    return x


@pytest.mark.parametrize("spelling", ["deterministic", "experimental_deterministic"])
def test_deterministic_false_lets_a_parallel_map_yield_results_as_they_finish(
        spelling: str) -> None:
    options = Options()
    setattr(options, spelling, False)
    ds = Dataset.range(4).map(slow_first, num_parallel_calls=4).with_options(options)
    assert sorted(ds) == [0, 1, 2, 3]
    assert list(ds)[-1] == 0
    ordered = Dataset.range(4).map(slow_first, num_parallel_calls=4)
    assert list(ordered) == [0, 1, 2, 3]


def test_the_map_argument_wins_over_the_option() -> None:
    ds = Dataset.range(4).map(slow_first, num_parallel_calls=4, deterministic=True)
    assert list(ds.with_options(Options(deterministic=False))) == [0, 1, 2, 3]
