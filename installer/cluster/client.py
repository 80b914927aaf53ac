"""The only user of the kubernetes client: the few node, pod and event calls the protocol makes,
on plain JSON dicts, with API failures mapped to the installer's errors."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from installer.errors import (
    ClusterApiForbidden,
    ClusterApiUnavailable,
    InstallerError,
    NodeNotFound,
)

log = logging.getLogger(__name__)

Json = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
COMPONENT = "nvidia-driver-installer"
# Who the API server records as owning the fields the protocol writes (managedFields): an
# admin's later cordon shows up under another manager and is never undone.
FIELD_MANAGER = "nvidia-driver-installer"
# Seconds per API request (connect, read): a hung API server must not hang the upgrade.
REQUEST_TIMEOUT = (10.0, 30.0)


class Conflict(Exception):
    """The object changed since it was read (HTTP 409): read it again and retry."""


class NodeClient:
    """Calls about one node: read and merge-patch it, list and evict its pods, post Events."""

    def __init__(self, node: str, kubeconfig: str | None) -> None:
        # Heavy: imported only with the protocol on. Typed loosely: its stubs vary by release.
        from kubernetes import client
        from kubernetes import config as kubeconfig_loader

        config: Any = kubeconfig_loader

        settings = client.Configuration()
        with _mapped("load the API credentials"):
            if kubeconfig:
                config.load_kube_config(config_file=kubeconfig, client_configuration=settings)
            else:
                config.load_incluster_config(client_configuration=settings)
        settings.retries = 1  # the protocol's own loops retry; fail fast on a dead server
        api = client.ApiClient(settings)
        self.node = node
        self._core: Any = client.CoreV1Api(api)
        self._models: Any = client

    def get_node(self) -> Json:
        """The Node object. Raises NodeNotFound, ClusterApi* errors."""
        with _mapped(f"read node {self.node}", node=self.node):
            return _json(self._core.read_node(self.node, _preload_content=False,
                                              _request_timeout=REQUEST_TIMEOUT))

    def patch_node(self, patch: Json) -> Json:
        """A JSON merge patch (RFC 7386) of the node. With metadata.resourceVersion in the patch
        the server refuses it when the node changed since: raises Conflict."""
        with _mapped(f"patch node {self.node}", node=self.node):
            return _json(self._core.patch_node(
                self.node, patch, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT))

    def pods_on_node(self) -> list[Json]:
        """Every pod bound to this node (field selector spec.nodeName)."""
        with _mapped(f"list the pods on node {self.node}"):
            answer = _json(self._core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node}", _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT))
        return list(answer.get("items") or [])

    def evict(self, namespace: str, name: str) -> str:
        """Ask the Eviction API to evict a pod: "evicted", "gone" (404) or "blocked" (429: a
        PodDisruptionBudget forbids it now)."""
        from kubernetes.client.exceptions import ApiException

        body = self._models.V1Eviction(
            metadata=self._models.V1ObjectMeta(name=name, namespace=namespace))
        try:
            with _mapped(f"evict pod {namespace}/{name}", passthrough=(404, 429)):
                self._core.create_namespaced_pod_eviction(
                    name, namespace, body, _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            return "gone" if exc.status == 404 else "blocked"
        return "evicted"

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod at once (grace period 0), bypassing PodDisruptionBudgets."""
        from kubernetes.client.exceptions import ApiException

        try:
            with _mapped(f"delete pod {namespace}/{name}", passthrough=(404,)):
                self._core.delete_namespaced_pod(
                    name, namespace, grace_period_seconds=0, _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT)
        except ApiException:
            pass  # already gone

    def event(self, node_uid: str, reason: str, message: str, warning: bool = False) -> None:
        """A core/v1 Event on the Node (`kubectl describe node` shows it). Best effort: a
        failure is logged, never raised."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
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
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            with _mapped("post an event"):
                self._core.create_namespaced_event("default", body, _preload_content=False,
                                                   _request_timeout=REQUEST_TIMEOUT)
        except InstallerError as exc:
            log.warning("could not post the %s event on node %s: %s", reason, self.node,
                        exc.message)


def _json(response: Any) -> Json:
    data = response.data
    return dict(json.loads(data.decode() if isinstance(data, bytes) else data))


@contextmanager
def _mapped(what: str, *, node: str | None = None,
            passthrough: tuple[int, ...] = ()) -> Iterator[None]:
    """Turn the client's exceptions into the installer's errors (or Conflict)."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:
        if exc.status in passthrough:
            raise
        detail = _status_message(exc)
        if exc.status == 409:
            raise Conflict(detail) from exc
        if exc.status == 404 and node:
            raise NodeNotFound(f"could not {what}: the API server has no node {node!r}") from exc
        if exc.status in (401, 403):
            raise ClusterApiForbidden(
                f"could not {what}: the API server answered {exc.status} ({detail})") from exc
        raise ClusterApiUnavailable(
            f"could not {what}: the API server answered {exc.status} ({detail})") from exc
    except (HTTPError, OSError, ConfigException) as exc:
        raise ClusterApiUnavailable(f"could not {what}: {exc}") from exc


def _status_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)
