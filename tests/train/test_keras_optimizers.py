"""cv.optimizers against Keras 3's numbers (fixtures/keras_optimizers.json, made by
fixtures/make_keras_optimizers.py with TensorFlow 2.21): every optimizer with every kit option
(schedules, clipping, weight decay), dense and sparse, in this process; a few on real
parameter servers; callable learning rates, bad arguments and checkpoints of new slots."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import convoy as cv
from convoy.distribute.partitioners import FixedShardsPartitioner
from convoy.errors import InvalidArgumentError
from convoy.testing import TrainingCluster

FIXTURE = Path(__file__).parent / "fixtures" / "keras_optimizers.json"
CASES = {case["key"]: case for case in json.loads(FIXTURE.read_text())["cases"]}
RTOL, ATOL = 1e-5, 1e-5


def decode(value):
    return np.array(value["data"], dtype=value["dtype"]).reshape(value["shape"])


def arguments(args):
    args = dict(args)
    rate = args.get("learning_rate")
    if isinstance(rate, dict):
        args["learning_rate"] = getattr(cv.optimizers.schedules, rate["class_name"])(
            **rate["config"])
    return args


def gradients(step):
    table = step["table"]
    if "indices" in table:
        table = cv.IndexedSlices(decode(table["values"]), np.array(table["indices"]))
    else:
        table = decode(table)
    return table, decode(step["bias"])


def run(case, optimizer, table, bias):
    """The table and bias after each of the case's steps."""
    after = []
    for step in case["steps"]:
        table_gradient, bias_gradient = gradients(step)
        optimizer.apply_gradients([(table_gradient, table), (bias_gradient, bias)])
        after.append((table.numpy(), bias.numpy()))
    return after


def check(case, after):
    initial = decode(case["initial"]["table"])
    touched = np.zeros(len(initial), bool)
    if case["sparse"]:
        touched[case["steps"][0]["table"]["indices"]] = True
    else:
        touched[:] = True
    for step, (expected, (table, bias)) in enumerate(zip(case["after"], after)):
        what = f"{case['key']} after step {step + 1}"
        np.testing.assert_allclose(bias, decode(expected["bias"]), RTOL, ATOL, err_msg=what)
        np.testing.assert_allclose(table[touched], decode(expected["table"])[touched], RTOL,
                                   ATOL, err_msg=what)
        # lazy sparse updates: rows without gradients stay (Keras moves some of them)
        np.testing.assert_array_equal(table[~touched], initial[~touched], err_msg=what)


def local_run(case, **overrides):
    optimizer = getattr(cv.optimizers, case["optimizer"])(**{**arguments(case["args"]),
                                                             **overrides})
    table = cv.Variable(decode(case["initial"]["table"]))
    bias = cv.Variable(decode(case["initial"]["bias"]))
    return run(case, optimizer, table, bias)


@pytest.mark.parametrize("key", list(CASES))
def test_matches_keras(key):
    check(CASES[key], local_run(CASES[key]))


def test_every_optimizer_and_option_is_covered():
    keys = set(CASES)
    for optimizer in ("sgd", "sgd_momentum", "sgd_nesterov", "adagrad", "adam", "adam_amsgrad",
                      "adamw", "rmsprop", "rmsprop_centered_momentum", "ftrl",
                      "ftrl_regularized"):
        for option in ("plain", "clipnorm", "clipvalue", "global_clipnorm", "weight_decay",
                       "schedule", "schedule_decay_clip"):
            for kind in ("dense", "sparse"):
                assert f"{optimizer}-{option}-{kind}" in keys
    schedules = {CASES[k]["args"]["learning_rate"]["class_name"] for k in keys
                 if isinstance(CASES[k]["args"]["learning_rate"], dict)}
    assert schedules == {"ExponentialDecay", "PiecewiseConstantDecay", "CosineDecay",
                         "InverseTimeDecay", "PolynomialDecay"}


@pytest.mark.parametrize("key", ["sgd-schedule0-dense", "adam-schedule-sparse",
                                 "ftrl_regularized-schedule_decay_clip-dense"])
def test_a_callable_of_the_step_is_a_schedule(key):
    case = CASES[key]
    schedule = arguments(case["args"])["learning_rate"]
    check(case, local_run(case, learning_rate=lambda step: schedule(step)))


def test_schedules_config_round_trip():
    for case in CASES.values():
        schedule = arguments(case["args"])["learning_rate"]
        if isinstance(schedule, cv.optimizers.schedules.LearningRateSchedule):
            again = type(schedule).from_config(schedule.get_config())
            assert again == schedule
            assert [again(s) for s in range(8)] == [schedule(s) for s in range(8)]


@pytest.mark.parametrize("make, problem", [
    (lambda: cv.optimizers.SGD(-0.1), "learning_rate must be a positive number"),
    (lambda: cv.optimizers.Adam("0.1"), "learning_rate"),
    (lambda: cv.optimizers.SGD(0.1, clipnorm=1.0, clipvalue=0.5),
     r"only one of clipnorm, clipvalue and global_clipnorm.*\['clipnorm', 'clipvalue'\]"),
    (lambda: cv.optimizers.Adam(global_clipnorm=1.0, clipnorm=1.0), "only one of"),
    (lambda: cv.optimizers.Adam(clipnorm=-1.0), "clipnorm must be > 0"),
    (lambda: cv.optimizers.Adam(clipvalue="1"), "clipvalue must be a finite number"),
    (lambda: cv.optimizers.SGD(weight_decay=-0.1), "weight_decay must be >= 0"),
    (lambda: cv.optimizers.AdamW(weight_decay=None), "weight_decay must be a number"),
    (lambda: cv.optimizers.Adam(amsgrad=1), "amsgrad must be True or False"),
    (lambda: cv.optimizers.RMSprop(rho=1.5), r"rho must be in \[0, 1\)"),
    (lambda: cv.optimizers.RMSprop(centered="yes"), "centered must be True or False"),
    (lambda: cv.optimizers.Ftrl(learning_rate_power=0.5), "learning_rate_power must be <= 0"),
    (lambda: cv.optimizers.Ftrl(l1_regularization_strength=-1.0),
     "l1_regularization_strength must be >= 0"),
    (lambda: cv.optimizers.Ftrl(initial_accumulator_value=-0.1),
     "initial_accumulator_value must be >= 0"),
    (lambda: cv.optimizers.schedules.ExponentialDecay(0.1, 0, 0.5), "decay_steps must be > 0"),
    (lambda: cv.optimizers.schedules.PiecewiseConstantDecay([1, 2], [0.1, 0.2]),
     "one more element"),
    (lambda: cv.optimizers.schedules.PolynomialDecay(0.1, 10, cycle=1), "cycle must be True"),
    (lambda: cv.optimizers.schedules.CosineDecay(0.1, 10, warmup_steps=-1),
     "warmup_steps must be >= 0"),
])
def test_bad_arguments(make, problem):
    with pytest.raises(InvalidArgumentError, match=problem):
        make()


def test_a_callable_that_gives_no_number_fails_clearly():
    optimizer = cv.optimizers.SGD(lambda step: "fast")
    w = cv.Variable(np.zeros(2, np.float32))
    with pytest.raises(InvalidArgumentError, match="gave 'fast', not a finite number"):
        optimizer.apply_gradients([(np.ones(2, np.float32), w)])


def test_learning_rate_follows_iterations():
    schedule = cv.optimizers.schedules.PiecewiseConstantDecay([0], [0.5, 0.25])
    optimizer = cv.optimizers.SGD(schedule)
    w = cv.Variable(np.zeros(2, np.float32))
    assert optimizer.learning_rate == 0.5
    optimizer.apply_gradients([(np.ones(2, np.float32), w)])
    assert optimizer.learning_rate == 0.25
    np.testing.assert_allclose(w.numpy(), [-0.5, -0.5])


def test_new_slots_round_trip_through_a_checkpoint(tmp_path):
    # RMSprop's three slots, the per-variable step of its schedule, and Ftrl's two.
    for case in (CASES["rmsprop_centered_momentum-schedule-sparse"],
                 CASES["ftrl_regularized-schedule_decay_clip-dense"]):
        optimizer = getattr(cv.optimizers, case["optimizer"])(**arguments(case["args"]))
        table = cv.Variable(decode(case["initial"]["table"]))
        bias = cv.Variable(decode(case["initial"]["bias"]))
        head, tail = dict(case, steps=case["steps"][:2]), dict(case, steps=case["steps"][2:])
        run(head, optimizer, table, bias)
        path = cv.train.Checkpoint(table=table, bias=bias, optimizer=optimizer).save(
            tmp_path / case["key"])
        expected = run(tail, optimizer, table, bias)
        # into new objects: their variables and slots come from the checkpoint
        optimizer = getattr(cv.optimizers, case["optimizer"])(**arguments(case["args"]))
        table = cv.Variable(np.zeros_like(decode(case["initial"]["table"])))
        bias = cv.Variable(np.zeros_like(decode(case["initial"]["bias"])))
        cv.train.Checkpoint(table=table, bias=bias, optimizer=optimizer).restore(path)
        assert int(optimizer.iterations) == 2
        for (want_table, want_bias), (table_now, bias_now) in zip(
                expected, run(tail, optimizer, table, bias)):
            np.testing.assert_array_equal(table_now, want_table)
            np.testing.assert_array_equal(bias_now, want_bias)


# ----- on parameter servers --------------------------------------------------------------------
PS_CASES = ["adam_amsgrad-schedule_decay_clip-sparse", "ftrl_regularized-schedule-sparse",
            "rmsprop_centered_momentum-schedule_decay_clip-dense", "sgd_nesterov-clipnorm-dense",
            "adagrad-schedule_decay_clip-sparse"]


@pytest.fixture(scope="module")
def cluster():
    with TrainingCluster(num_workers=1, num_ps=2) as training_cluster:
        yield training_cluster


@pytest.mark.timeout(120)
@pytest.mark.parametrize("key", PS_CASES)
def test_matches_keras_on_parameter_servers(cluster, key):
    # the table in two shards on two ps, its bias on one of them: each shard counts its steps
    case = CASES[key]
    strategy = cv.distribute.ParameterServerStrategy(cluster.resolver(),
                                                     FixedShardsPartitioner(2))
    with strategy.scope():
        table = cv.Variable(decode(case["initial"]["table"]), name="table")
        bias = cv.Variable(decode(case["initial"]["bias"]), name="bias")
        optimizer = getattr(cv.optimizers, case["optimizer"])(**arguments(case["args"]))
    assert isinstance(table, cv.distribute.ShardedVariable)
    check(case, run(case, optimizer, table, bias))
    assert int(optimizer.iterations) == len(case["steps"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rate", ["schedule", "callable"])
def test_matches_keras_from_scheduled_functions(cluster, rate):
    # the optimizer pickled to a worker: a schedule travels as data, a callable reads the
    # optimizer's iterations on its parameter server
    case = CASES["adamw-schedule_decay_clip-sparse"]
    strategy = cv.distribute.ParameterServerStrategy(cluster.resolver(),
                                                     FixedShardsPartitioner(2))
    coordinator = cv.distribute.ClusterCoordinator(strategy)
    args = arguments(case["args"])
    if rate == "callable":
        schedule = args["learning_rate"]
        args["learning_rate"] = lambda step: schedule(step)
    with strategy.scope():
        table = cv.Variable(decode(case["initial"]["table"]), name="table")
        bias = cv.Variable(decode(case["initial"]["bias"]), name="bias")
        optimizer = getattr(cv.optimizers, case["optimizer"])(**args)

    def step(table_gradient, bias_gradient):
        optimizer.apply_gradients([(table_gradient, table), (bias_gradient, bias)])

    after = []
    try:
        for gradients_of_step in case["steps"]:
            coordinator.schedule(step, args=gradients(gradients_of_step))
            coordinator.join()  # one step at a time, as Keras's
            after.append((table.numpy(), bias.numpy()))
    finally:
        coordinator.shutdown()
    check(case, after)
