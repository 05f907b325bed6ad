"""deploy/k8s/autoscaling: the data workers sized by the dispatcher's estimate, through KEDA
(a ScaledObject, checked against KEDA's CRD schema pinned in fixtures/keda) or a
HorizontalPodAutoscaler on an External metric (checked against the pinned Kubernetes) fed by
prometheus-adapter's rule. Both follow ``max(convoy_data_optimal_workers)`` with the same
bounds and pace, their queries parse, kustomize renders each component on the base without
the Deployment's replica count, and a worker scaled down has longer than its drain to stop."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml

from convoy import monitoring
from convoy.cli import build_parser
from convoy.data.service import _worker_server

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
AUTOSCALING = K8S / "autoscaling"
KUBERNETES_VERSION = "1.33.0"  # as test_deploy.py
#: KEDA's ScaledObject schema (pinned: fixtures/keda/README.md).
KEDA_SCHEMA = Path(__file__).parent / "fixtures" / "keda" / "scaledobject-v1alpha1.json"
METRIC = "convoy_data_optimal_workers"
COMPONENTS = ("keda", "hpa")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def scaled_object() -> dict[str, Any]:
    return load(AUTOSCALING / "keda" / "scaled-object.yaml")


def autoscaler() -> dict[str, Any]:
    return load(AUTOSCALING / "hpa" / "horizontal-pod-autoscaler.yaml")


def adapter_rule() -> dict[str, Any]:
    (rule,) = load(AUTOSCALING / "hpa" / "prometheus-adapter-values.yaml")["rules"]["external"]
    return rule


def data_workers() -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all((K8S / "data-workers.yaml").read_text())
                if d["kind"] == "Deployment")


def strict(schema: Any) -> Any:
    """``schema`` refusing unknown fields in every object it describes (a typo fails)."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(item) for item in schema]
    return schema


def keda_schema() -> dict[str, Any]:
    schema = json.loads(KEDA_SCHEMA.read_text())
    schema["properties"]["metadata"] = {"type": "object"}  # checked as Kubernetes' below
    return strict(schema)


def test_the_horizontal_pod_autoscaler_validates_against_the_pinned_kubernetes() -> None:
    kubernetes_validate.validate(autoscaler(), KUBERNETES_VERSION, strict=True)


def test_the_scaled_object_validates_against_kedas_schema() -> None:
    document = scaled_object()
    jsonschema.validate(document, keda_schema())
    kubernetes_validate.validate(  # its metadata, as any object's
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": document["metadata"]},
        KUBERNETES_VERSION, strict=True)


def test_the_keda_fixture_refuses_what_keda_would() -> None:
    broken = scaled_object()
    broken["spec"]["minReplicas"] = 1  # the HorizontalPodAutoscaler's name, not KEDA's
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, keda_schema())


def test_both_scale_the_data_worker_deployment_on_the_estimate_alike() -> None:
    workers = data_workers()
    target = {"apiVersion": workers["apiVersion"], "kind": workers["kind"],
              "name": workers["metadata"]["name"]}
    keda, hpa = scaled_object()["spec"], autoscaler()["spec"]
    assert keda["scaleTargetRef"] == hpa["scaleTargetRef"] == target
    assert (keda["minReplicaCount"], keda["maxReplicaCount"]) == (
        hpa["minReplicas"], hpa["maxReplicas"]) == (1, 8)
    # the same pace: grow at once, shrink after a stabilization window
    assert keda["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["behavior"]
    assert hpa["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 60
    # a target of 1 per replica: the replicas are the estimate itself
    (trigger,) = keda["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "1"
    (metric,) = hpa["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert metric["external"]["metric"] == {"name": adapter_rule()["name"]["as"]}


def exported_families() -> set[str]:
    """The names of every family convoy exports (all roles)."""
    for role in monitoring.ROLES:
        monitoring.export(role)
    return {family.name for family in monitoring.REGISTRY.collect()}


def test_the_queries_parse_and_read_the_estimate_convoy_exports() -> None:
    assert METRIC in exported_families()
    query = scaled_object()["spec"]["triggers"][0]["metadata"]["query"]
    promql_parser.parse(query)  # ValueError if it does not parse
    assert query == f"max({METRIC})"
    rule = adapter_rule()
    assert re.fullmatch(rule["name"]["matches"], METRIC)
    promql_parser.parse(rule["seriesQuery"])
    # the adapter fills in the series and the HorizontalPodAutoscaler's namespace
    filled = (rule["metricsQuery"].replace("<<.Series>>", METRIC)
              .replace("<<.LabelMatchers>>", 'namespace="convoy"'))
    promql_parser.parse(filled)
    assert filled == f'max({METRIC}{{namespace="convoy"}})'
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}


def test_a_worker_scaled_down_has_longer_than_its_drain_to_stop() -> None:
    spec = data_workers()["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    parsed = build_parser().parse_args(
        [a.replace("$(POD_IP)", "10.1.2.3") for a in container["args"]])
    stopping = (float(parsed.drain_timeout) + _worker_server.STOP_WAIT_S
                + _worker_server.STOP_GRACE_S + 10)  # + the deregistration call
    assert spec["terminationGracePeriodSeconds"] > stopping


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl renders the components")
@pytest.mark.parametrize("component, kind", [("keda", "ScaledObject"),
                                             ("hpa", "HorizontalPodAutoscaler")])
def test_kustomize_renders_each_component_on_the_base(component: str, kind: str,
                                                      tmp_path: Path) -> None:
    """Either component with the base: the base's objects, its autoscaler and not the other's,
    and the Deployment without a replica count for an apply to reset."""
    base = os.path.relpath(K8S, tmp_path)  # kustomize takes relative paths only
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": [base], "components": [f"{base}/autoscaling/{component}"]}))
    rendered = [d for d in yaml.safe_load_all(subprocess.run(
        ["kubectl", "kustomize", str(tmp_path)], check=True, capture_output=True, text=True,
        timeout=60).stdout) if d]
    kinds = [d["kind"] for d in rendered]
    assert kinds.count(kind) == 1
    assert not {"ScaledObject", "HorizontalPodAutoscaler"} - {kind} & set(kinds)
    workers = next(d for d in rendered if d["kind"] == "Deployment"
                   and d["metadata"]["name"] == "convoy-worker")
    assert "replicas" not in workers["spec"]


def test_the_autoscalers_are_components_the_base_leaves_out() -> None:
    """A cluster runs one autoscaler for the Deployment: the base has neither, each is a
    component to add."""
    for component in COMPONENTS:
        assert load(AUTOSCALING / component / "kustomization.yaml")["kind"] == "Component"
    assert not any(r.startswith("autoscaling")
                   for r in load(K8S / "kustomization.yaml")["resources"])
