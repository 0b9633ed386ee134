"""deploy/kubernetes/*.yaml against the Kubernetes API's schemas, without a cluster: built-in kinds with
kubernetes-validate (the API's OpenAPI schemas, strict: an unknown or misspelled field fails, as
`kubectl apply --validate=strict` would), the InferencePool with its CRD's schema (vendored in tests/data,
held strict the same way: the API server would silently prune an unknown field). Then what the manifests
must say for tgictl: probes on the routes the worker contract defines, and the gateway, the pool and the
pods agreeing on labels and ports."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml


REPO_ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = REPO_ROOT / "deploy" / "kubernetes"
INFERENCE_POOL_SCHEMA = REPO_ROOT / "tests" / "data" / "kubernetes" / "inferencepool-v1.schema.json"
KUBERNETES_VERSION = "1.33"


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Every object with declared properties and no additionalProperties refuses others."""
    schema = copy.deepcopy(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return schema


def by_kind(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.mark.parametrize("name,doc", documents(), ids=lambda v: v if isinstance(v, str) else v.get("kind"))
def test_every_manifest_is_valid_against_its_schema(name: str, doc: dict[str, Any]) -> None:
    if doc["apiVersion"] == "inference.networking.k8s.io/v1":
        schema = _strict(json.loads(INFERENCE_POOL_SCHEMA.read_text()))
        jsonschema.validate(doc, schema)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_validators_catch_what_they_should() -> None:
    pod = copy.deepcopy(by_kind("Deployment", "tgictl"))
    pod["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/health"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    pool = copy.deepcopy(by_kind("InferencePool", "tgictl"))
    pool["spec"]["targetPortNumber"] = 8080  # the pre-v1 field
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pool, _strict(json.loads(INFERENCE_POOL_SCHEMA.read_text())))


def test_tgictl_pods_probe_health_as_operations_md_says() -> None:
    container = by_kind("Deployment", "tgictl")["spec"]["template"]["spec"]["containers"][0]
    # docs/operations.md: /health for all three (it never waits for a step; 503 while draining).
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health", probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # minutes to load before liveness counts
    assert "--hostname=0.0.0.0" in container["args"] and "--port=8080" in container["args"]
    grace = next(a for a in container["args"] if a.startswith("--graceful-termination-timeout="))
    pod = by_kind("Deployment", "tgictl")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > float(grace.split("=")[1])  # the drain fits before SIGKILL


def test_the_gateway_and_the_pool_find_the_pods() -> None:
    labels = by_kind("Deployment", "tgictl")["spec"]["template"]["metadata"]["labels"]
    smg = by_kind("Deployment", "smg")["spec"]["template"]["spec"]["containers"][0]["args"]
    selector = smg[smg.index("--selector") + 1]
    key, value = selector.split("=")
    assert labels[key] == value and "--service-discovery-port=8080" in smg
    assert any(a.startswith("--model-alias=tgi=") for a in smg)
    pool = by_kind("InferencePool", "tgictl")["spec"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    assert pool["targetPorts"] == [{"number": 8080}]
    role = by_kind("Role", "smg-pod-reader")["rules"][0]
    assert role["resources"] == ["pods"] and {"list", "watch"} <= set(role["verbs"])
