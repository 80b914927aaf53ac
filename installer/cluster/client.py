"""The few node, pod and event calls the upgrade protocol and the scheduling gate make, as
plain JSON over HTTP(S) (the standard library's http.client: a warm run with the protocol on
reads one node, and a client library's import would cost it more than everything else it does),
with API failures mapped to the installer's errors."""

from __future__ import annotations

import http.client
import json
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from installer import __version__
from installer.cluster import credentials
from installer.errors import (
    ClusterApiForbidden,
    ClusterApiUnavailable,
    InstallerError,
    NodeNotFound,
)

if TYPE_CHECKING:
    from installer.config import Config

log = logging.getLogger(__name__)

Json = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
# A strategic merge patch merges status.conditions by `type` (the kubelet's and Node Problem
# Detector's conditions stay as they are); a JSON merge patch would replace the whole list.
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
COMPONENT = "nvidia-driver-installer"
# Who the API server records as owning the fields the protocol writes (managedFields): an
# admin's later cordon shows up under another manager and is never undone.
FIELD_MANAGER = "nvidia-driver-installer"
# The NvidiaDriverReady condition's own manager: managedFields tell it apart from the kubelet's
# conditions and from the protocol's writes.
CONDITION_MANAGER = "nvidia-driver-installer-condition"
# The driver version's labels and annotations (cluster/driver_labels.py): applied server-side,
# so the API server tracks exactly which keys are the installer's and removes one it stops
# sending.
DRIVER_VERSION_MANAGER = "nvidia-driver-installer-driver-version"
APPLY_PATCH = "application/apply-patch+yaml"
# Seconds to connect, then to wait for each answer: a hung API server must not hang the upgrade.
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 30.0
USER_AGENT = f"{COMPONENT}/{__version__}"
# resource.k8s.io versions whose ResourceClaims the installer reads, preferred first.
RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1")


class Conflict(Exception):
    """The object changed since it was read (HTTP 409): read it again and retry."""


class NodeClient:
    """Calls about one node: read and merge-patch it, list and delete its pods (and read the
    PodDisruptionBudgets that guard them), post Events."""

    def __init__(self, node: str, kubeconfig: str | None) -> None:
        self.node = node
        self._server = credentials.load(kubeconfig)
        self._resource_version: str | None = None  # "" once asked: none served

    def get_node(self) -> Json:
        """The Node object. Raises NodeNotFound, ClusterApi* errors."""
        return self._call("GET", f"/api/v1/nodes/{quote(self.node)}",
                          what=f"read node {self.node}", node=self.node)[1]

    def patch_node(self, patch: Json) -> Json:
        """A JSON merge patch (RFC 7386) of the node. With metadata.resourceVersion in the patch
        the server refuses it when the node changed since: raises Conflict."""
        return self._call("PATCH", f"/api/v1/nodes/{quote(self.node)}",
                          {"fieldManager": FIELD_MANAGER}, body=patch, content_type=MERGE_PATCH,
                          what=f"patch node {self.node}", node=self.node)[1]

    def apply_node(self, body: Json) -> Json:
        """A server-side apply of the node (JSON is YAML) under DRIVER_VERSION_MANAGER, forced:
        the installer is the authority on the keys it sends, whoever set them before (a
        controller that labelled them by hand gives them up, as Kubernetes' guidance for
        controllers says)."""
        return self._call("PATCH", f"/api/v1/nodes/{quote(self.node)}",
                          {"fieldManager": DRIVER_VERSION_MANAGER, "force": "true"},
                          body=body, content_type=APPLY_PATCH,
                          what=f"apply the driver version to node {self.node}",
                          node=self.node)[1]

    def patch_status(self, patch: Json) -> Json:
        """A strategic merge patch of the node's status subresource (nodes/status): the
        conditions it names are merged by type."""
        return self._call("PATCH", f"/api/v1/nodes/{quote(self.node)}/status",
                          {"fieldManager": CONDITION_MANAGER}, body=patch,
                          content_type=STRATEGIC_MERGE_PATCH,
                          what=f"patch the status of node {self.node}", node=self.node)[1]

    def pods_on_node(self) -> list[Json]:
        """Every pod bound to this node (field selector spec.nodeName; an answer about another
        node's pod is dropped, whatever the server sent)."""
        answer = self._call("GET", "/api/v1/pods", {"fieldSelector": f"spec.nodeName={self.node}"},
                            what=f"list the pods on node {self.node}")[1]
        return [pod for pod in answer.get("items") or []
                if isinstance(pod, dict) and (pod.get("spec") or {}).get("nodeName") == self.node]

    def nodes_labelled(self, label_selector: str) -> list[Json]:
        """The Nodes a label selector picks (the pool policy's budget counts its pool's nodes
        mid-upgrade)."""
        answer = self._call("GET", "/api/v1/nodes", {"labelSelector": label_selector},
                            what=f"list the nodes labelled {label_selector}")[1]
        return [node for node in answer.get("items") or [] if isinstance(node, dict)]

    def pod_disruption_budgets(self, namespace: str) -> list[Json]:
        """The PodDisruptionBudgets of one namespace, with the status the disruption controller
        keeps."""
        answer = self._call("GET", f"/apis/policy/v1/namespaces/{quote(namespace)}/"
                            "poddisruptionbudgets",
                            what=f"list the PodDisruptionBudgets of namespace {namespace}")[1]
        return [pdb for pdb in answer.get("items") or [] if isinstance(pdb, dict)]

    def resource_version(self) -> str | None:
        """The resource.k8s.io version to read claims through (v1 from Kubernetes 1.34,
        v1beta2 on 1.33, v1beta1 on 1.32: status.allocation.devices.results[].driver is the
        same in each), or None where the group is not served. Asked once per client."""
        if self._resource_version is None:
            status, answer = self._call("GET", "/apis/resource.k8s.io",
                                        what="discover the resource.k8s.io API versions",
                                        passthrough=(404,))
            served = {str(v.get("version")) for v in answer.get("versions") or []
                      if isinstance(v, dict)} if status != 404 else set()
            self._resource_version = next((v for v in RESOURCE_VERSIONS if v in served), "")
        return self._resource_version or None

    def resource_claim(self, namespace: str, name: str) -> Json | None:
        """A ResourceClaim (through the version the cluster serves), or None when it is gone
        (404) or the cluster serves no resource.k8s.io version the installer reads."""
        version = self.resource_version()
        if version is None:
            return None
        status, answer = self._call(
            "GET", f"/apis/resource.k8s.io/{version}/namespaces/{quote(namespace)}/"
            f"resourceclaims/{quote(name)}", what=f"read ResourceClaim {namespace}/{name}",
            passthrough=(404,))
        return None if status == 404 else answer

    def delete_pod(self, namespace: str, name: str, uid: str,
                   grace_seconds: int | None = None) -> str:
        """Delete the pod with this uid (a precondition: a pod of the same name created since is
        not touched), with its own grace period or `grace_seconds`: "deleted", "gone" (404) or
        "replaced" (409: the name now belongs to another pod). The admission policy admits it
        only for a pod on the token's own node."""
        options: Json = {"apiVersion": "v1", "kind": "DeleteOptions",
                         "preconditions": {"uid": uid}}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        status, _ = self._call("DELETE", _pod_path(namespace, name), body=options,
                               what=f"delete pod {namespace}/{name}", passthrough=(404, 409))
        return {404: "gone", 409: "replaced"}.get(status, "deleted")

    def event(self, node_uid: str, reason: str, message: str, warning: bool = False,
              action: str = "") -> None:
        """A core/v1 Event on the Node (`kubectl describe node` shows it); `action` is what
        the installer did or failed to do (the Event's action field). Best effort: a failure
        is logged, never raised."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body: Json = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{self.node}.{uuid.uuid4().hex[:16]}",
                         "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node,
                               "uid": node_uid},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT, "host": self.node},
            # events.k8s.io's reportingController/Instance under their core/v1 names
            "reportingComponent": COMPONENT,
            "reportingInstance": f"{COMPONENT}-{self.node}"[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if action:
            body["action"] = action[:128]
        try:
            self._call("POST", "/api/v1/namespaces/default/events", body=body,
                       what="post an event")
        except (InstallerError, Conflict) as exc:
            log.warning("could not post the %s event on node %s: %s", reason, self.node, exc)

    def token_review(self, token: str) -> Json:
        """authentication.k8s.io/v1 TokenReview of a client's bearer token: the API server's
        answer (status.authenticated, status.user). The token is sent in the body only, and
        never logged."""
        body: Json = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                      "spec": {"token": token}}
        return self._call("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body,
                          what="review a scraper's token")[1]

    def subject_access_review(self, user: Json, path: str, verb: str) -> Json:
        """authorization.k8s.io/v1 SubjectAccessReview: may the user TokenReview named
        (username, uid, groups, extra) `verb` the non-resource URL `path`? The API server's
        answer (status.allowed)."""
        spec: Json = {"nonResourceAttributes": {"path": path, "verb": verb}}
        for source, target in (("username", "user"), ("uid", "uid"), ("groups", "groups"),
                               ("extra", "extra")):
            if user.get(source):
                spec[target] = user[source]
        body: Json = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                      "spec": spec}
        return self._call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                          body=body, what=f"ask whether {user.get('username')!r} may {verb} "
                          f"{path}")[1]

    def _call(self, method: str, path: str, query: dict[str, str] | None = None, *,
              body: Json | None = None, content_type: str = "application/json", what: str,
              node: str | None = None, passthrough: tuple[int, ...] = ()) -> tuple[int, Json]:
        """One request; its status and JSON answer. A status in `passthrough` is returned
        (its answer empty); other failures raise the installer's errors (or Conflict)."""
        server = self._server
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        token = server.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        target = server.base_path + path + (f"?{urlencode(query)}" if query else "")
        connection: http.client.HTTPConnection
        if server.tls is not None:
            connection = _TlsConnection(server.host, server.port, timeout=CONNECT_TIMEOUT,
                                        context=server.tls, server_name=server.server_name)
        else:
            connection = http.client.HTTPConnection(server.host, server.port,
                                                    timeout=CONNECT_TIMEOUT)
        try:
            connection.connect()
            assert connection.sock is not None
            connection.sock.settimeout(READ_TIMEOUT)
            connection.request(method, target, body=data, headers=headers)
            response = connection.getresponse()
            status, raw = response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ClusterApiUnavailable(f"could not {what}: {exc or type(exc).__name__}") \
                from exc
        finally:
            connection.close()
        if status in passthrough:
            return status, {}
        if status >= 400:
            raise _refusal(status, _status_message(raw, response.reason), what, node)
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ClusterApiUnavailable(f"could not {what}: the API server's answer is not "
                                        "JSON") from exc
        if not isinstance(answer, dict):
            raise ClusterApiUnavailable(f"could not {what}: the API server's answer is not "
                                        "a JSON object")
        return status, answer


class _TlsConnection(http.client.HTTPSConnection):
    """HTTPS that checks the certificate against `server_name` (a kubeconfig's
    tls-server-name) when given, else against the host connected to."""

    def __init__(self, host: str, port: int, *, timeout: float, context: Any,
                 server_name: str | None) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_name = server_name

    def connect(self) -> None:
        if not self._server_name:
            super().connect()
            return
        http.client.HTTPConnection.connect(self)
        context: Any = self._context  # type: ignore[attr-defined]
        self.sock = context.wrap_socket(self.sock, server_hostname=self._server_name)


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"


def _refusal(status: int, detail: str, what: str, node: str | None) -> Exception:
    if status == 409:
        return Conflict(detail)
    if status == 404 and node:
        return NodeNotFound(f"could not {what}: the API server has no node {node!r}")
    if status in (401, 403):
        return ClusterApiForbidden(
            f"could not {what}: the API server answered {status} ({detail})")
    return ClusterApiUnavailable(f"could not {what}: the API server answered {status} ({detail})")


def _status_message(raw: bytes, reason: str) -> str:
    """The message of the API server's Status object, else the HTTP reason phrase."""
    try:
        return str(json.loads(raw).get("message") or reason)
    except (TypeError, ValueError, AttributeError):
        return reason


def for_node(config: Config) -> NodeClient:
    """The client for the node this run is on, with the configured kubeconfig (or the pod's
    service account). Config validation guarantees the node's name wherever the upgrade
    protocol, the scheduling gate or the cluster signals are on."""
    assert config.node_name
    return NodeClient(config.node_name, config.kubeconfig)
