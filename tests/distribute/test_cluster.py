"""convoy.distribute.cluster (ClusterSpec, PS validation) and the cluster resolvers."""

from __future__ import annotations

import json
import pickle

import pytest

import convoy as cv
from convoy.distribute import ClusterSpec, cluster_resolver
from convoy.distribute.cluster import validate_cluster_for_ps, validate_task
from convoy.distribute.cluster_resolver import (
    ClusterResolver,
    SimpleClusterResolver,
    TFConfigClusterResolver,
    format_master_url,
)
from convoy.errors import InvalidArgumentError, NotFoundError

CLUSTER = {
    "chief": ["host0:2222"],
    "worker": ["host1:2222", "host2:2222", "host3:2222"],
    "ps": ["host4:2222", "host5:2222"],
}


# --- ClusterSpec -------------------------------------------------------------------------------

def test_dense_spec_queries():
    spec = ClusterSpec(CLUSTER)
    assert spec.jobs == ["chief", "ps", "worker"]
    assert spec.num_tasks("worker") == 3
    assert spec.num_tasks("chief") == 1
    assert spec.task_indices("ps") == [0, 1]
    assert spec.task_address("worker", 2) == "host3:2222"
    assert spec.job_tasks("ps") == ["host4:2222", "host5:2222"]
    assert spec.as_dict() == CLUSTER
    assert "ps" in spec and "evaluator" not in spec
    assert list(spec.tasks())[:2] == [("chief", 0, "host0:2222"), ("ps", 0, "host4:2222")]
    assert bool(spec)


def test_sparse_spec():
    spec = ClusterSpec({"worker": {1: "b:1", 3: "d:3"}, "ps": {0: "p:0"}})
    assert spec.num_tasks("worker") == 2
    assert spec.task_indices("worker") == [1, 3]
    assert spec.task_address("worker", 3) == "d:3"
    assert spec.job_tasks("worker") == [None, "b:1", None, "d:3"]
    # indices 0..n-1 come back as a list, gaps as a dict
    assert spec.as_dict() == {"ps": ["p:0"], "worker": {1: "b:1", 3: "d:3"}}


def test_spec_from_json_style_string_keys_and_tuples():
    spec = ClusterSpec({"worker": {"0": "a:1", "1": "b:2"}, "ps": ("c:3",)})
    assert spec == ClusterSpec({"worker": ["a:1", "b:2"], "ps": ["c:3"]})


def test_copy_equality_hash_repr_pickle():
    spec = ClusterSpec(CLUSTER)
    copy = ClusterSpec(spec)
    assert copy == spec and copy is not spec
    assert spec == CLUSTER                      # a dict compares by content
    assert spec != {"worker": ["x:1"]}
    assert spec != {"worker": "not a list"}     # not constructible -> simply unequal
    assert spec != 42
    assert hash(copy) == hash(spec)
    assert repr(ClusterSpec({"ps": ["p:1"], "worker": ["w:1"]})) == (
        "ClusterSpec({'ps': ['p:1'], 'worker': ['w:1']})")
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_empty_spec_is_falsy():
    for spec in (ClusterSpec({}), ClusterSpec(), ClusterSpec(None)):
        assert not spec
        assert spec.jobs == [] and spec.as_dict() == {}


def test_job_with_no_tasks():
    spec = ClusterSpec({"worker": []})
    assert spec.jobs == ["worker"] and spec.num_tasks("worker") == 0
    assert spec.job_tasks("worker") == [] and spec.as_dict() == {"worker": []}


@pytest.mark.parametrize(
    "cluster, message",
    [
        (["a:1"], "must be a dict"),
        ("worker", "must be a dict"),
        ({"worker": "a:1"}, "tasks of job 'worker' must be a list"),
        ({"worker": 3}, "tasks of job 'worker' must be a list"),
        ({"worker": ["a:1", ""]}, "address of task 1 of job 'worker'"),
        ({"worker": ["a:1", 5]}, "address of task 1 of job 'worker'"),
        ({"worker": {1.5: "a:1"}}, "task indices of job 'worker' must be integers"),
        ({"worker": {-1: "a:1"}}, "must be >= 0"),
        ({"worker": {True: "a:1"}}, "must be integers"),
        ({"worker": {0: "a:1", "0": "b:2"}}, "more than once"),
        ({1: ["a:1"]}, "job names must be strings"),
        ({"": ["a:1"]}, "non-empty"),
        ({"ps": ["a:1"], b"ps": ["b:1"]}, "more than once"),
    ],
)
def test_spec_rejects(cluster, message):
    with pytest.raises(InvalidArgumentError, match=message):
        ClusterSpec(cluster)


def test_unknown_job_or_task_is_not_found():
    spec = ClusterSpec({"worker": ["a:1"], "ps": {2: "p:2"}})
    with pytest.raises(NotFoundError, match="no job named 'chief'"):
        spec.num_tasks("chief")
    with pytest.raises(NotFoundError, match="no job named"):
        spec.job_tasks("evaluator")
    with pytest.raises(NotFoundError, match=r"no task with index 0; its task indices are \[2\]"):
        spec.task_address("ps", 0)
    with pytest.raises(NotFoundError, match="no task with index 5"):
        spec.task_address("worker", 5)


# --- validate_cluster_for_ps -------------------------------------------------------------------

@pytest.mark.parametrize(
    "cluster, task_type, task_id",
    [
        (CLUSTER, None, None),
        (CLUSTER, "chief", 0),
        ({"worker": ["w:1"], "ps": ["p:1"]}, None, None),                  # chief is optional
        ({"worker": ["w:1"], "ps": ["p:1"], "evaluator": ["e:1"]}, "evaluator", 0),
        ({"worker": ["w:1"], "ps": ["p:1"]}, "evaluator", 0),              # evaluator may be absent
        ({"worker": {3: "w:3"}, "ps": {1: "p:1"}, "chief": ["c:0"]}, "chief", None),
    ],
)
def test_validate_accepts(cluster, task_type, task_id):
    spec = validate_cluster_for_ps(cluster, task_type, task_id)
    assert isinstance(spec, ClusterSpec) and spec == ClusterSpec(cluster)


@pytest.mark.parametrize(
    "cluster, task_type, task_id, message",
    [
        ({}, None, None, "cluster spec is empty"),
        ({"worker": ["w:1"], "ps": ["p:1"], "master": ["m:1"]}, None, None,
         r"job\(s\) \['master'\]"),
        (CLUSTER, "trainer", None, "unknown task_type 'trainer'"),
        (CLUSTER, "worker", 0, "cannot run as a 'worker' task"),
        (CLUSTER, "ps", 1, "cannot run as a 'ps' task"),
        ({"worker": ["w:1"], "ps": ["p:1"]}, "chief", 0,
         "task_type 'chief' is not a job of the cluster spec"),
        ({"worker": ["w:1"], "ps": ["p:1"], "chief": ["c:1", "c:2"]}, None, None,
         "at most one 'chief' task, the cluster spec has 2"),
        ({"worker": ["w:1"], "ps": ["p:1"], "evaluator": ["e:1", "e:2"]}, None, None,
         "at most one 'evaluator' task"),
        (CLUSTER, "chief", 1, r"The `task_id` 1 exceeds the maximum id of chief\."),
        (CLUSTER, "chief", -1, "task_id must be an integer >= 0"),
        ({"worker": ["w:1"], "chief": ["c:1"]}, None, None, "at least one 'ps' task"),
        ({"worker": ["w:1"], "ps": []}, None, None, "at least one 'ps' task"),
        ({"ps": ["p:1"], "chief": ["c:1"]}, "chief", 0, "at least one 'worker' task"),
    ],
)
def test_validate_rejects(cluster, task_type, task_id, message):
    with pytest.raises(InvalidArgumentError, match=message):
        validate_cluster_for_ps(cluster, task_type, task_id)


@pytest.mark.parametrize(
    "cluster, task_type, task_id, message",
    [
        (CLUSTER, "worker", 3, r"^The `task_id` 3 exceeds the maximum id of worker\.$"),
        (CLUSTER, "ps", 7, r"^The `task_id` 7 exceeds the maximum id of ps\.$"),
        ({"worker": {1: "w:1", 3: "w:3"}}, "worker", 2, r"task indices are \[1, 3\]"),
        ({"worker": {1: "w:1", 3: "w:3"}}, "worker", 4, "exceeds the maximum id of worker"),
        (CLUSTER, "evaluator", 0, "`task_type` 'evaluator' not found in cluster_spec"),
        (CLUSTER, "worker", True, "task_id must be an integer"),
    ],
)
def test_validate_task_rejects(cluster, task_type, task_id, message):
    # TensorFlow's task-id check: tensorflow/python/distribute/multi_worker_util.py,
    # _validate_cluster_spec; here for a server's own task too
    with pytest.raises(ValueError, match=message):
        validate_task(cluster, task_type, task_id)


def test_validate_task_accepts_every_task():
    for job, index, _ in ClusterSpec(CLUSTER).tasks():
        validate_task(CLUSTER, job, index)
    validate_task({"worker": {1: "w:1", 3: "w:3"}}, "worker", 3)


def test_strategy_refuses_a_task_id_beyond_the_cluster():
    resolver = SimpleClusterResolver(CLUSTER, task_type="chief", task_id=1)
    with pytest.raises(ValueError, match=r"The `task_id` 1 exceeds the maximum id of chief\."):
        cv.distribute.ParameterServerStrategy(resolver)


def test_validate_accepts_a_resolver_spec():
    resolver = SimpleClusterResolver(CLUSTER, task_type="chief", task_id=0)
    spec = validate_cluster_for_ps(resolver.cluster_spec(), resolver.task_type,
                                   resolver.task_id)
    assert spec is resolver.cluster_spec()


# --- SimpleClusterResolver ---------------------------------------------------------------------

def test_simple_resolver():
    r = SimpleClusterResolver(ClusterSpec(CLUSTER), task_type="worker", task_id=1)
    assert isinstance(r, ClusterResolver)
    assert r.cluster_spec() == ClusterSpec(CLUSTER)
    assert (r.task_type, r.task_id, r.rpc_layer) == ("worker", 1, "grpc")
    assert r.master() == ""                                   # no master given
    assert r.master("ps", 1) == "grpc://host5:2222"
    assert r.master("ps", 1, rpc_layer="grpc+verbs") == "grpc+verbs://host5:2222"
    r.task_type, r.task_id, r.rpc_layer = "chief", 0, None
    assert (r.task_type, r.task_id, r.rpc_layer) == ("chief", 0, None)
    assert r.master("chief", 0) == "host0:2222"
    assert "SimpleClusterResolver(" in repr(r)


def test_simple_resolver_from_dict_and_master_argument():
    r = SimpleClusterResolver({"worker": ["w:1"], "ps": ["p:1"]}, master="w:1",
                              environment="local")
    assert isinstance(r.cluster_spec(), ClusterSpec)
    assert r.master() == "grpc://w:1"
    assert r.environment == "local"
    assert (r.task_type, r.task_id) == (None, None)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"task_id": -1}, "task_id"),
        ({"task_id": 1.5}, "task_id"),
        ({"task_type": 3}, "task_type"),
        ({"task_type": ""}, "task_type"),
        ({"rpc_layer": 5}, "rpc_layer"),
        ({"master": None}, "master"),
    ],
)
def test_simple_resolver_rejects(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        SimpleClusterResolver(CLUSTER, **kwargs)


def test_format_master_url():
    assert format_master_url("h:1", "grpc") == "grpc://h:1"
    assert format_master_url("h:1") == "h:1"
    assert format_master_url("", "grpc") == ""


# --- TFConfigClusterResolver -------------------------------------------------------------------

def _set_tf_config(monkeypatch, config):
    monkeypatch.setenv("TF_CONFIG", config if isinstance(config, str) else json.dumps(config))


def test_tf_config_reads_cluster_task_and_rpc_layer(monkeypatch):
    _set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 2},
                                 "rpc_layer": "grpc"})
    r = TFConfigClusterResolver()
    assert r.cluster_spec() == ClusterSpec(CLUSTER)
    assert (r.task_type, r.task_id, r.rpc_layer) == ("worker", 2, "grpc")
    assert r.master() == "grpc://host3:2222"
    assert r.master("ps", 0) == "grpc://host4:2222"
    assert r.master("ps", 0, rpc_layer="http") == "http://host4:2222"
    assert r.environment is None


def test_tf_config_string_index_and_no_rpc_layer(monkeypatch):
    _set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "ps", "index": "1"}})
    r = TFConfigClusterResolver()
    assert (r.task_type, r.task_id, r.rpc_layer) == ("ps", 1, None)
    assert r.master() == "host5:2222"


def test_tf_config_arguments_and_setters_override(monkeypatch):
    _set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 0},
                                 "rpc_layer": "grpc"})
    r = TFConfigClusterResolver(task_type="chief", task_id=0, rpc_layer="http",
                                environment="google")
    assert (r.task_type, r.task_id, r.rpc_layer, r.environment) == ("chief", 0, "http", "google")
    r.task_type, r.task_id, r.rpc_layer = "ps", "1", "grpc"
    assert (r.task_type, r.task_id, r.rpc_layer) == ("ps", 1, "grpc")
    r.task_type = r.task_id = r.rpc_layer = None        # back to the environment
    assert (r.task_type, r.task_id, r.rpc_layer) == ("worker", 0, "grpc")


def test_tf_config_is_read_on_every_query(monkeypatch):
    r = TFConfigClusterResolver()
    _set_tf_config(monkeypatch, {"cluster": {"worker": ["a:1"]}})
    assert r.cluster_spec().jobs == ["worker"]
    _set_tf_config(monkeypatch, {"cluster": {"ps": ["p:1"]}})
    assert r.cluster_spec().jobs == ["ps"]


@pytest.mark.parametrize("value", [None, "", "  ", "{}"])
def test_tf_config_missing_or_empty(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        _set_tf_config(monkeypatch, value)
    r = TFConfigClusterResolver()
    assert r.cluster_spec() == ClusterSpec({}) and not r.cluster_spec()
    assert (r.task_type, r.task_id, r.rpc_layer) == (None, None, None)
    assert r.master() == ""


def test_tf_config_master_rules(monkeypatch):
    # session_master wins
    _set_tf_config(monkeypatch, {"cluster": CLUSTER, "session_master": "grpc://elsewhere:1"})
    assert TFConfigClusterResolver().master() == "grpc://elsewhere:1"
    # one job with one task: nothing to connect to
    _set_tf_config(monkeypatch, {"cluster": {"worker": ["w:1"]},
                                 "task": {"type": "worker", "index": 0}, "rpc_layer": "grpc"})
    assert TFConfigClusterResolver().master() == ""
    # several tasks but no way to tell which one is meant
    _set_tf_config(monkeypatch, {"cluster": CLUSTER})
    with pytest.raises(InvalidArgumentError, match="which task"):
        TFConfigClusterResolver().master()
    assert TFConfigClusterResolver(task_type="ps", task_id=1).master() == "host5:2222"


@pytest.mark.parametrize(
    "raw, message",
    [
        ("{not json", "not valid JSON"),
        ('{"cluster": {"worker": ["a:1"]},}', "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('"worker"', "JSON object"),
        ('{"cluster": ["a:1"]}', r"TF_CONFIG\['cluster'\] must be a JSON object"),
        ('{"task": "worker"}', r"TF_CONFIG\['task'\] must be a JSON object"),
        ('{"task": {"index": 0}}', r"under 'type'"),
        ('{"cluster": {"worker": "a:1"}}', r"TF_CONFIG\['cluster'\] is malformed"),
    ],
)
def test_tf_config_malformed(monkeypatch, raw, message):
    _set_tf_config(monkeypatch, raw)
    r = TFConfigClusterResolver()   # reading is lazy: errors come from the queries
    with pytest.raises(InvalidArgumentError, match=message) as info:
        r.cluster_spec()
    assert "TF_CONFIG" in str(info.value)


@pytest.mark.parametrize(
    "task, attribute, message",
    [
        ({"type": "worker", "index": "x"}, "task_id", r"TF_CONFIG\['task'\]\['index'\]"),
        ({"type": "worker", "index": -1}, "task_id", r"TF_CONFIG\['task'\]\['index'\]"),
        ({"type": 7, "index": 0}, "task_type", r"TF_CONFIG\['task'\]\['type'\]"),
    ],
)
def test_tf_config_bad_task_fields(monkeypatch, task, attribute, message):
    _set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": task})
    with pytest.raises(InvalidArgumentError, match=message):
        getattr(TFConfigClusterResolver(), attribute)


def test_tf_config_bad_rpc_layer(monkeypatch):
    _set_tf_config(monkeypatch, {"cluster": CLUSTER, "rpc_layer": 3})
    with pytest.raises(InvalidArgumentError, match="rpc_layer"):
        _ = TFConfigClusterResolver().rpc_layer


def test_tf_config_feeds_validation(monkeypatch):
    _set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "chief", "index": 0}})
    r = TFConfigClusterResolver()
    assert validate_cluster_for_ps(r.cluster_spec(), r.task_type, r.task_id) == CLUSTER
    _set_tf_config(monkeypatch, {"cluster": CLUSTER, "task": {"type": "worker", "index": 0}})
    with pytest.raises(InvalidArgumentError, match="'worker'"):
        validate_cluster_for_ps(r.cluster_spec(), r.task_type, r.task_id)


def test_package_exports():
    import convoy.distribute as distribute

    assert distribute.ClusterSpec is ClusterSpec
    assert distribute.cluster_resolver is cluster_resolver
    assert {"ClusterSpec", "cluster_resolver", "partitioners"} <= set(distribute.__all__)


def test_a_server_refuses_a_task_index_beyond_the_cluster():
    with pytest.raises(ValueError, match=r"The `task_id` 3 exceeds the maximum id of worker\."):
        cv.distribute.Server(CLUSTER, "worker", 3, insecure=True)
