"""deploy/: every Kubernetes manifest validates offline against one pinned Kubernetes version,
every convoy flag they use is one the command takes, each pod's shell entry builds a valid
TF_CONFIG from its ordinal, and the Dockerfile (no image can be built here) is checked by
parsing. The manifests pass the restricted Pod Security Standard, take their images' version
from kustomization.yaml, and come with Services, disruption budgets, a network policy and
grace periods a hardened cluster needs; deploy/monitoring's ServiceMonitor and alerts validate
against the Prometheus Operator's schemas (fixtures) and their PromQL parses."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml

import convoy
from convoy import monitoring
from convoy.cli import build_parser
from convoy.data.service import _worker_server

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
#: The Kubernetes version the manifests are checked against (schemas bundled with
#: kubernetes-validate, pinned in the dev extra).
KUBERNETES_VERSION = "1.33.0"
SERVER_COMMANDS = ("dispatcher", "worker", "server")

KUSTOMIZATION = DEPLOY / "k8s" / "kustomization.yaml"
MANIFESTS = sorted(set((DEPLOY / "k8s").glob("*.yaml")) - {KUSTOMIZATION})
DOCUMENTS = [(path.name, index, document) for path in MANIFESTS
             for index, document in enumerate(yaml.safe_load_all(path.read_text()))
             if document is not None]


def workloads(kind: str | None = None) -> list[dict[str, Any]]:
    return [d for _, _, d in DOCUMENTS
            if d["kind"] in ("Deployment", "StatefulSet", "Job") and kind in (None, d["kind"])]


def named(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, _, d in DOCUMENTS
                if d["kind"] == kind and d["metadata"]["name"] == name)


def containers() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) of every container of every workload."""
    return [(w, c) for w in workloads() for c in w["spec"]["template"]["spec"]["containers"]]


def convoy_command(container: dict[str, Any]) -> list[str] | None:
    """The convoy command line a container runs (the image's entrypoint is ``convoy``), or
    None if it runs something else."""
    if "command" not in container:
        return list(container["args"])
    script = " ".join(container["args"])
    match = re.search(r"\bexec convoy (.*)$", script)
    return shlex.split(match[1]) if match else None


def server_containers() -> list[tuple[dict[str, Any], dict[str, Any], list[str]]]:
    found = []
    for workload, container in containers():
        command = convoy_command(container)
        if command is not None:
            found.append((workload, container, command))
    return found


def option(command: list[str], flag: str) -> str | None:
    for argument in command:
        if argument.startswith(flag + "="):
            return argument.split("=", 1)[1]
    return None


def test_there_are_manifests_for_each_role():
    kinds = {(d["kind"], d["metadata"]["name"]) for _, _, d in DOCUMENTS}
    assert {("StatefulSet", "convoy-dispatcher"), ("Service", "convoy-dispatcher"),
            ("Deployment", "convoy-worker"), ("StatefulSet", "convoy-ps"),
            ("Service", "convoy-ps"), ("StatefulSet", "convoy-train-worker")} <= kinds
    assert {command[0] for _, _, command in server_containers()} == set(SERVER_COMMANDS)


@pytest.mark.parametrize("name, index, document", DOCUMENTS,
                         ids=[f"{name}#{index}-{d['kind']}" for name, index, d in DOCUMENTS])
def test_every_manifest_validates_against_the_pinned_kubernetes(name, index, document):
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


@functools.cache
def help_text(command: str) -> str:
    return subprocess.run([sys.executable, "-m", "convoy", command, "--help"], check=True,
                          capture_output=True, text=True, timeout=60).stdout


def test_every_convoy_flag_in_the_manifests_is_one_the_command_takes():
    for workload, _, command in server_containers():
        subcommand, *arguments = command
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", " ".join(arguments)):
            assert re.search(rf"(?<![\w-]){flag}\b", help_text(subcommand)), (
                workload["metadata"]["name"], flag)
        # and the whole command line parses, with the downward API's value put in
        build_parser().parse_args([a.replace("$(POD_IP)", "10.1.2.3") for a in command])


def test_every_server_has_its_probes_on_its_metrics_port():
    for _, container, command in server_containers():
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert str(ports["metrics"]) == option(command, "--metrics-port"), container["name"]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert option(command, "--host") == "0.0.0.0"  # the probes come from the node


def test_every_server_reads_the_secret_from_a_kubernetes_secret_others_cannot_read():
    for workload, container, command in server_containers():
        token_file = option(command, "--auth-token-file")
        assert token_file is not None, container["name"]
        mount = next(m for m in container["volumeMounts"]
                     if m["mountPath"] == os.path.dirname(token_file))
        volume = next(v for v in workload["spec"]["template"]["spec"]["volumes"]
                      if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == "convoy-auth"
        assert not volume["secret"]["defaultMode"] & stat.S_IROTH
        assert os.path.basename(token_file) == "token"  # the Secret's key


def test_the_dispatcher_keeps_its_journal_on_a_persistent_volume():
    dispatcher = named("StatefulSet", "convoy-dispatcher")
    (container,) = dispatcher["spec"]["template"]["spec"]["containers"]
    command = convoy_command(container)
    assert command is not None and "--fault-tolerant" in command
    claims = {c["metadata"]["name"] for c in dispatcher["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts[option(command, "--work-dir")] in claims
    service = named("Service", "convoy-dispatcher")
    assert {p["port"] for p in service["spec"]["ports"]} >= {int(option(command, "--port"))}


def test_data_workers_scale_and_advertise_their_pod_address():
    workers = named("Deployment", "convoy-worker")
    (container,) = workers["spec"]["template"]["spec"]["containers"]
    command = convoy_command(container)
    assert option(command, "--address") == f"$(POD_IP):{option(command, '--port')}"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert option(command, "--dispatcher") == "convoy-dispatcher:5050"


def run_entry(container: dict[str, Any], hostname: str, tmp_path: Path) -> dict[str, Any]:
    """Run a container's shell entry with stand-ins for ``convoy`` and ``python`` that print
    what they were given; the TF_CONFIG they saw."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for program in ("convoy", "python"):
        stand_in = bin_dir / program
        stand_in.write_text('#!/bin/sh\nprintf "%s" "$TF_CONFIG"\n')
        stand_in.chmod(0o755)
    cluster = named("ConfigMap", "convoy-training")["data"]["cluster"]
    assert container["command"] == ["/bin/sh", "-c"]
    done = subprocess.run(["/bin/sh", "-c", *container["args"]], capture_output=True,
                          text=True, timeout=30, check=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOSTNAME": hostname,
                               "CLUSTER": cluster})
    return json.loads(done.stdout)


@pytest.mark.parametrize("statefulset, job", [("convoy-ps", "ps"),
                                              ("convoy-train-worker", "worker")])
def test_a_training_pod_builds_its_tf_config_from_its_ordinal(statefulset, job, tmp_path):
    workload = named("StatefulSet", statefulset)
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    cluster = json.loads(named("ConfigMap", "convoy-training")["data"]["cluster"])
    replicas = workload["spec"]["replicas"]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    service = workload["spec"]["serviceName"]
    assert named("Service", service)["spec"]["clusterIP"] == "None"  # headless
    assert cluster[job] == [f"{statefulset}-{i}.{service}:{port}" for i in range(replicas)]
    for ordinal in range(replicas):
        tf_config = run_entry(container, f"{statefulset}-{ordinal}", tmp_path)
        assert tf_config == {"cluster": cluster, "task": {"type": job, "index": ordinal}}


@pytest.mark.parametrize("statefulset", ["convoy-ps", "convoy-train-worker"])
def test_a_training_task_framed_port_is_fixed_and_open(statefulset):
    """Others reach a task's framed port directly (a ps's Execute, a worker's Run): under
    network policies or fixed container ports it must be the one the pod and its Service
    declare."""
    workload = named("StatefulSet", statefulset)
    [(container, command)] = [(c, cmd) for w, c, cmd in server_containers() if w is workload]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert str(ports["framed"]) == option(command, "--framed-port")
    service = named("Service", workload["spec"]["serviceName"])
    assert {"name": "framed", "port": ports["framed"], "targetPort": "framed"} in \
        service["spec"]["ports"]


def test_the_trainer_is_the_chief_and_points_at_the_service(tmp_path):
    (container,) = named("Job", "convoy-trainer")["spec"]["template"]["spec"]["containers"]
    tf_config = run_entry(container, "convoy-trainer-abcde", tmp_path)
    assert tf_config["task"] == {"type": "chief", "index": 0}
    env = {e["name"]: e for e in container["env"]}
    assert env["CONVOY_SERVICE"]["value"] == "grpc://convoy-dispatcher:5050"
    assert env["CONVOY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "convoy-auth",
                                                                    "key": "token"}


# -- the Dockerfile ---------------------------------------------------------------------------
def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    logical, pending = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        logical.append((keyword.upper(), " ".join(rest.split())))
        pending = ""
    assert not pending, "a continuation line ends the file"
    return logical


def test_the_dockerfile_builds_a_cpu_image_that_runs_convoy_as_another_user():
    steps = instructions(DEPLOY / "Dockerfile")
    assert steps[0] == ("FROM", "python:3.11-slim")
    assert sum(keyword == "FROM" for keyword, _ in steps) == 1
    assert steps[-2:] == [("ENTRYPOINT", '["convoy"]'), ("CMD", '["--help"]')]
    user = [rest for keyword, rest in steps if keyword == "USER"]
    assert user and user[-1] not in ("root", "0")
    makefile_torch = re.search(r"^TORCH_VERSION \?= (\S+)$", (ROOT / "Makefile").read_text(),
                               re.MULTILINE)
    assert makefile_torch is not None
    assert ("ARG", f"TORCH_VERSION={makefile_torch[1]}") in steps
    runs = [rest for keyword, rest in steps if keyword == "RUN"]
    torch = next(run for run in runs if "torch==" in run)
    assert '"torch==${TORCH_VERSION}"' in torch
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch
    assert runs.index(torch) < next(i for i, run in enumerate(runs) if "pip install \".[" in run)
    for keyword, rest in steps:
        if keyword == "COPY":  # every source it copies exists and is not ignored
            for source in rest.split()[:-1]:
                assert (ROOT / source).exists(), source
                ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
                assert f"!{source.rstrip('/')}/" in ignored or f"!{source}" in ignored, source


# -- a hardened cluster -----------------------------------------------------------------------
def pod_specs() -> list[tuple[str, dict[str, Any]]]:
    return [(w["metadata"]["name"], w["spec"]["template"]["spec"]) for w in workloads()]


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


#: The volume types the restricted Pod Security Standard admits.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def test_every_pod_passes_the_restricted_pod_security_standard():
    """The restricted profile's checks (and the baseline's it includes), as the Pod Security
    admission controller makes them for each pod and container."""
    for name, spec in pod_specs():
        pod = spec["securityContext"]
        assert not any(spec.get(f) for f in ("hostNetwork", "hostPID", "hostIPC")), name
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for volume in spec.get("volumes", []):
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, (name, volume)
        for container in all_containers(spec):
            context = container["securityContext"]
            where = (name, container["name"])
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert context["runAsNonRoot"] is True, where
            assert context.get("runAsUser", pod["runAsUser"]) != 0, where
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert not context.get("privileged"), where
            assert not any("hostPort" in port for port in container.get("ports", [])), where


def test_root_filesystems_are_read_only_and_tmp_is_writable():
    for name, spec in pod_specs():
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in all_containers(spec):
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], name


def test_the_image_runs_as_the_user_and_group_of_every_pod():
    steps = instructions(DEPLOY / "Dockerfile")
    user = [rest for keyword, rest in steps if keyword == "USER"][-1]
    run = " ".join(rest for keyword, rest in steps if keyword == "RUN")
    for name, spec in pod_specs():
        pod = spec["securityContext"]
        assert user == f"{pod['runAsUser']}:{pod['runAsGroup']}", name
        assert f"--uid {pod['runAsUser']} --gid {pod['runAsGroup']}" in run
        assert f"groupadd --gid {pod['runAsGroup']}" in run


def images() -> dict[str, str]:
    """newName:newTag of each image name kustomization.yaml sets."""
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    return {i["name"]: f"{i['newName']}:{i['newTag']}" for i in kustomization["images"]}


def test_the_images_version_is_set_in_one_place_the_kustomization():
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    assert sorted(kustomization["resources"]) == sorted(path.name for path in MANIFESTS)
    tags = {i["newTag"] for i in kustomization["images"]}
    assert tags == {convoy.__version__}  # the images of this version of convoy
    for name, image in images().items():
        registry = image.split("/", 1)[0]
        assert "." in registry or ":" in registry, f"{name}: name its registry: {image}"
    for name, spec in pod_specs():
        for container in all_containers(spec):
            image = container["image"]
            assert ":" not in image and "@" not in image, f"{name}: the tag is kustomize's"
            assert image in images(), (name, image)


def service_for(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The Services whose selector picks ``workload``'s pods."""
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return [d for _, _, d in DOCUMENTS if d["kind"] == "Service"
            and d["spec"]["selector"].items() <= labels.items()]


def test_each_statefulset_is_governed_by_a_headless_service():
    for workload in workloads("StatefulSet"):
        service = named("Service", workload["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None", workload["metadata"]["name"]
        assert service in service_for(workload)


def test_the_dispatcher_is_reached_even_when_not_ready():
    """Its client Service lists it whatever its readiness says: heartbeats and status calls
    still reach a dispatcher whose journal's disk is full."""
    service = named("Service", "convoy-dispatcher")
    assert service["spec"].get("clusterIP") != "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service in service_for(named("StatefulSet", "convoy-dispatcher"))
    port = service["spec"]["ports"][0]["port"]
    for _, _, command in server_containers():
        if command[0] == "worker":
            assert option(command, "--dispatcher") == f"convoy-dispatcher:{port}"


@pytest.mark.parametrize("workload", ["convoy-dispatcher", "convoy-ps"])
def test_a_node_drain_does_not_evict_the_dispatcher_or_a_parameter_server(workload):
    labels = named("StatefulSet", workload)["spec"]["template"]["metadata"]["labels"]
    budgets = [d for _, _, d in DOCUMENTS if d["kind"] == "PodDisruptionBudget"
               and d["spec"]["selector"]["matchLabels"].items() <= labels.items()]
    assert len(budgets) == 1, workload
    assert budgets[0]["spec"]["maxUnavailable"] == 0


def test_the_network_policy_admits_convoy_pods_and_prometheus_only():
    (policy,) = [d for _, _, d in DOCUMENTS if d["kind"] == "NetworkPolicy"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    for workload in workloads():
        assert selected.items() <= workload["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    own, prometheus = policy["spec"]["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": selected}}]}
    assert prometheus["from"] == [{"namespaceSelector": {},
                                   "podSelector": {"matchLabels": {
                                       "app.kubernetes.io/name": "prometheus"}}}]
    assert prometheus["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    for _, container in containers():  # the port it names is each pod's metrics port
        assert "metrics" in {p["name"] for p in container["ports"]}


def drain_timeout(command: list[str]) -> float:
    """The SIGTERM drain a data worker's command line asks for (the flag's default if none)."""
    parsed = build_parser().parse_args([a.replace("$(POD_IP)", "10.1.2.3") for a in command])
    return float(parsed.drain_timeout)


def test_every_pod_gets_longer_than_its_drain_to_stop():
    """A data worker drains for --drain-timeout, then waits for its last calls and
    deregisters; the others stop at once. Each pod's grace period is explicit and longer."""
    for name, spec in pod_specs():
        assert spec["terminationGracePeriodSeconds"] >= 15, name
    for workload, _, command in server_containers():
        if command[0] == "worker":
            stopping = (drain_timeout(command) + _worker_server.STOP_WAIT_S
                        + _worker_server.STOP_GRACE_S + 10)  # + the deregistration call
            grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            assert grace > stopping, (grace, stopping)


# -- Prometheus Operator's resources ----------------------------------------------------------
#: The Prometheus Operator's CRD schemas, as the npm package
#: @kubernetes-models/prometheus-operator (pinned: fixtures/prometheus-operator/README.md)
#: carries them.
SCHEMAS = Path(__file__).parent / "fixtures" / "prometheus-operator"
MONITORING = [document for path in sorted((DEPLOY / "monitoring").glob("*.yaml"))
              for document in yaml.safe_load_all(path.read_text()) if document is not None]


def strict(schema: Any) -> Any:
    """``schema`` refusing unknown fields in every object it describes (a typo fails), as
    kubernetes-validate's strict schemas do."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(item) for item in schema]
    return schema


def crd_schema(kind: str) -> dict[str, Any]:
    schema = json.loads((SCHEMAS / f"{kind.lower()}-v1.json").read_text())
    schema["properties"]["metadata"] = {"type": "object"}  # checked as Kubernetes' below
    return strict(schema)


@pytest.mark.parametrize("document", MONITORING, ids=[d["kind"] for d in MONITORING])
def test_the_monitoring_resources_validate_against_the_operators_schemas(document):
    jsonschema.validate(document, crd_schema(document["kind"]))
    kubernetes_validate.validate(  # its metadata, as any object's
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": document["metadata"]},
        KUBERNETES_VERSION, strict=True)


def test_a_schema_fixture_refuses_what_the_operator_would():
    (rule,) = [d for d in MONITORING if d["kind"] == "PrometheusRule"]
    broken = json.loads(json.dumps(rule))
    broken["spec"]["groups"][0]["rules"][0]["exprs"] = "up"  # a typo'd field
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, crd_schema("PrometheusRule"))


def test_prometheus_scrapes_every_convoy_server():
    (monitor,) = [d for d in MONITORING if d["kind"] == "ServiceMonitor"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    port = monitor["spec"]["endpoints"][0]["port"]
    for workload in workloads():
        scraped = [s for s in service_for(workload)
                   if selector.items() <= s["metadata"]["labels"].items()
                   and port in {p["name"] for p in s["spec"]["ports"]}]
        assert len(scraped) == 1, workload["metadata"]["name"]  # once, not twice


def exported_families() -> set[str]:
    """The names of every family convoy exports (all roles), as PromQL sees them."""
    for role in monitoring.ROLES:
        monitoring.export(role)
    names = set()
    for family in monitoring.REGISTRY.collect():
        names.update(sample.name for sample in family.samples)
    return names


ALERTS = {"ConvoyDataWorkerLost", "ConvoyConsumersWaiting", "ConvoyJournalFailing",
          "ConvoyCallsRefused", "ConvoyWorkerBufferFull"}


def test_the_five_alerts_parse_and_use_only_metrics_convoy_exports():
    (rule,) = [d for d in MONITORING if d["kind"] == "PrometheusRule"]
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    exported = exported_families()
    for alert in rules:
        promql_parser.parse(alert["expr"])  # ValueError if it does not parse
        used = set(re.findall(r"\b(convoy_[a-z_]+)\b", alert["expr"]))
        assert used and used <= exported, (alert["alert"], used - exported)
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(convoy_refused_calls_total[5m])")


# -- the dispatcher's journal in a bucket (the overlay deploy/k8s-bucket) ------------------------
BUCKET = DEPLOY / "k8s-bucket"


def json_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    """``document`` with the RFC 6902 ``operations`` the overlay uses (add, replace, remove)
    applied, as kustomize applies them."""
    document = json.loads(json.dumps(document))
    for operation in operations:
        *parents, last = operation["path"].strip("/").split("/")
        node = document
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        key = int(last) if isinstance(node, list) else last
        if operation["op"] == "remove":
            del node[key]
        else:
            assert operation["op"] in ("add", "replace"), operation
            assert operation["op"] == "add" or key in node or isinstance(node, list), operation
            node[key] = operation["value"]
    return document


def bucket_dispatcher() -> dict[str, Any]:
    kustomization = yaml.safe_load((BUCKET / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../k8s"]
    (patch,) = kustomization["patches"]
    assert patch["target"] == {"kind": "StatefulSet", "name": "convoy-dispatcher"}
    operations = yaml.safe_load((BUCKET / patch["path"]).read_text())
    return json_patch(named("StatefulSet", "convoy-dispatcher"), operations)


def test_the_bucket_variant_keeps_the_dispatchers_journal_in_a_bucket():
    dispatcher = bucket_dispatcher()
    kubernetes_validate.validate(dispatcher, KUBERNETES_VERSION, strict=True)
    (container,) = dispatcher["spec"]["template"]["spec"]["containers"]
    command = convoy_command(container)
    assert command is not None and "--fault-tolerant" in command
    assert (option(command, "--work-dir") or "").startswith("s3://")
    build_parser().parse_args(command)
    assert "volumeClaimTemplates" not in dispatcher["spec"]  # no volume bound to a node
    assert "work-dir" not in {m["name"] for m in container["volumeMounts"]}
    # the credentials: the backend's standard variables, from a Secret
    assert container["envFrom"] == [{"secretRef": {"name": "convoy-s3"}}]
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        assert f"--from-literal={variable}=" in (BUCKET / "kustomization.yaml").read_text()
    # all else as the volume's dispatcher: the overlay follows the base's flags
    (base,) = named("StatefulSet", "convoy-dispatcher")["spec"]["template"]["spec"]["containers"]
    base_command = convoy_command(base)
    assert base_command is not None
    assert [a for a in command if not a.startswith("--work-dir")] == [
        a for a in base_command if not a.startswith("--work-dir")]
    assert {m["mountPath"] for m in container["volumeMounts"]} == {
        m["mountPath"] for m in base["volumeMounts"]} - {option(base_command, "--work-dir")}
    # and the image can reach a bucket
    assert any('pip install ".[' in run and "s3" in run.split("[")[1].split("]")[0]
               for keyword, run in instructions(DEPLOY / "Dockerfile") if keyword == "RUN")


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl renders the overlay")
def test_kustomize_renders_the_bucket_variant_as_tested():
    rendered = subprocess.run(["kubectl", "kustomize", str(BUCKET)], check=True,
                              capture_output=True, text=True, timeout=60).stdout
    dispatcher = next(d for d in yaml.safe_load_all(rendered) if d["kind"] == "StatefulSet"
                      and d["metadata"]["name"] == "convoy-dispatcher")
    expected = bucket_dispatcher()
    assert dispatcher["spec"]["template"]["spec"]["containers"][0]["args"] == (
        expected["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "volumeClaimTemplates" not in dispatcher["spec"]
