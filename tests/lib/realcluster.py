"""Nodes of the session's real control plane (tests/lib/controlplane.py) set up for one test:
the shipped RBAC bound to a ServiceAccount of the test's own (its name ends in
nvidia-driver-installer, as the shipped policies match it), the shipped policies enforced, a
token from the TokenRequest API bound to a Pod on the Node, and the installer pointed at the
server through the fault-injecting proxy (tests/lib/apiproxy.py), which records its requests.

The Nodes keep the names the tests assert on; a test's Nodes, token Pods and bindings are
deleted when it ends, so the next test starts from a clean server."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lib.apiproxy import ApiProxy
from lib.controlplane import ApiError, ControlPlane

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = REPO / "daemonset" / "components"
_enforced: set[Path] = set()


def apply_policies(cp: ControlPlane, policy_file: Path) -> None:
    """The shipped policy file applied as shipped, and waited for: the server's admission
    plugin learns of a new policy and binding through its informer."""
    if policy_file in _enforced:
        return
    done = cp.apply("apply", "--server-side", "--force-conflicts", "-f", str(policy_file))
    assert done.returncode == 0, done.stderr
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(policy_file.read_text())
             if d and d["kind"] == "ValidatingAdmissionPolicyBinding"]
    deadline = time.monotonic() + 60
    for name in names:
        while True:
            with contextlib.suppress(ApiError):
                cp.get(f"/apis/admissionregistration.k8s.io/v1/"
                       f"validatingadmissionpolicybindings/{name}")
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
    # No status tells when the admission plugin has the binding: a second's margin, once.
    time.sleep(1.0)
    _enforced.add(policy_file)


@dataclass
class RealNodes:
    """One test's objects on the real server; `close` removes them."""

    cp: ControlPlane
    account: str
    namespace: str = "kube-system"
    nodes: list[str] = field(default_factory=list)
    bindings: list[str] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)

    def bind(self, rbac_file: Path) -> None:
        """The file's ClusterRoles and Roles as shipped, bound to this test's account."""
        for doc in yaml.safe_load_all(rbac_file.read_text()):
            if not doc:
                continue
            kind = doc["kind"]
            if kind in ("ClusterRole", "Role"):
                done = self.cp.apply("apply", "--server-side", "--force-conflicts", "-f", "-",
                                     stdin=yaml.safe_dump(doc))
                assert done.returncode == 0, done.stderr
                continue
            binding = dict(doc)
            name = f"{doc['metadata']['name']}-{self.account}"[:253]
            binding["metadata"] = {**doc["metadata"], "name": name}
            binding["subjects"] = [{"kind": "ServiceAccount", "name": self.account,
                                    "namespace": self.namespace}]
            ns = doc["metadata"].get("namespace")
            path = (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings" if ns
                    else "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")
            self.cp.create(path, binding)
            self.bindings.append(f"{path}/{name}")

    def unbind(self) -> None:
        for path in self.bindings:
            with contextlib.suppress(ApiError):
                self.cp.request("DELETE", path)
        self.bindings.clear()

    def wait_allowed(self, verb: str, resource: str, subresource: str = "",
                     *, allowed: bool = True) -> None:
        """Until the server's RBAC authorizer (fed by an informer) answers as expected for
        this account: a SubjectAccessReview, as the administrator."""
        user = f"system:serviceaccount:{self.namespace}:{self.account}"
        deadline = time.monotonic() + 30
        while True:
            review = self.cp.create(
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                {"spec": {"user": user, "groups": ["system:serviceaccounts",
                                                   f"system:serviceaccounts:{self.namespace}",
                                                   "system:authenticated"],
                          "resourceAttributes": {"verb": verb, "resource": resource,
                                                 "subresource": subresource}}})
            if bool(review["status"].get("allowed")) == allowed:
                return
            assert time.monotonic() < deadline, f"RBAC never answered {allowed} for {verb}"
            time.sleep(0.1)

    def node(self, name: str, labels: dict[str, str] | None = None,
             status: dict[str, Any] | None = None) -> dict[str, Any]:
        obj = self.cp.node(name, labels=labels, ready=status is None)
        self.nodes.append(name)
        if status is not None:
            obj = self.cp.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": status},
                                  content_type="application/strategic-merge-patch+json")
        return obj

    def get_node(self, name: str) -> dict[str, Any]:
        return self.cp.get(f"/api/v1/nodes/{name}")

    def token(self, node: str) -> str:
        pod = re.sub(r"[^a-z0-9-]", "-", f"{self.account}-{node}")[:63].strip("-")
        self.pods.append(pod)
        return self.cp.pod_token(node, account=self.account, namespace=self.namespace, pod=pod)

    def events(self, node: str) -> list[dict[str, Any]]:
        """Events about this test's Node `node` (by its uid), oldest first."""
        uid = self.get_node(node)["metadata"]["uid"]
        found = self.cp.get("/api/v1/namespaces/default/events",
                            query={"fieldSelector": f"involvedObject.uid={uid}"})["items"]
        return sorted(found, key=lambda e: int(e["metadata"]["resourceVersion"]))

    def close(self) -> None:
        self.unbind()
        for pod in self.pods:
            with contextlib.suppress(ApiError):
                self.cp.request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{pod}",
                                {"gracePeriodSeconds": 0})
        for node in self.nodes:
            with contextlib.suppress(ApiError):
                self.cp.request("DELETE", f"/api/v1/nodes/{node}")
        # The Nodes are gone once the server says 404: the next test may reuse the names.
        for node in self.nodes:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    self.get_node(node)
                except ApiError as e:
                    if e.status == 404:
                        break
                time.sleep(0.05)


_accounts = iter(range(1_000_000))


@contextlib.contextmanager
def real_nodes(cp: ControlPlane, tmp_path: Path) -> Iterator[tuple[RealNodes, ApiProxy]]:
    account = f"t{next(_accounts)}-nvidia-driver-installer"
    cp.service_account("kube-system", account)
    nodes = RealNodes(cp, account)
    with ApiProxy(cp, tmp_path / "proxy-tls") as proxy:
        try:
            yield nodes, proxy
        finally:
            nodes.close()


@contextlib.contextmanager
def component_nodes(cp: ControlPlane, tmp_path: Path,
                    *component_dirs: Path) -> Iterator[tuple[RealNodes, ApiProxy]]:
    """real_nodes with each component's admission policy applied and its RBAC bound to the
    installer's account, as the DaemonSet's components bring them."""
    with real_nodes(cp, tmp_path) as (real, proxy):
        for directory in component_dirs:
            apply_policies(cp, directory / "admission-policy.yaml")
            real.bind(directory / "rbac.yaml")
        yield real, proxy


@dataclass
class OnRealNodes:
    """What a test holds of a component_nodes: the nodes, the proxy that records the
    installer's requests, and the server behind them."""

    real: RealNodes
    proxy: ApiProxy

    @property
    def cp(self) -> ControlPlane:
        return self.real.cp
