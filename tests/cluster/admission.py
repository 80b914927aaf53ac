"""ValidatingAdmissionPolicy evaluation for the stand-in API server and the policy tests: the
policy's own CEL expressions (cel-python), run against admission requests shaped as the API
server builds them (kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy,
k8s.io/api/admission/v1 AdmissionRequest).

Semantics followed: matchConstraints.resourceRules (operations, resources with "res/subres"),
matchConditions (all true, else the policy is skipped), variables (in order, each seeing the
ones before; one that fails to evaluate makes any expression using it fail), validations (the
first false one denies with its message or messageExpression; an evaluation error denies under
failurePolicy Fail), the reason's HTTP code (Forbidden 403, Invalid 422, Unauthorized 401), and
the message the API server writes: `ValidatingAdmissionPolicy '<policy>' with binding
'<binding>' denied request: <message>`. The `authorizer` variable (k8s.io/apiserver
pkg/cel/library Authz: group, resource, subresource, namespace, name, check, allowed, reason,
errored) asks an Authorizer, which answers for the request's user from RBAC rules; without one
every check is denied, as for a user nothing is bound to. `<list>.join(<sep>)` of the Kubernetes
CEL environment's strings library (messageExpressions use it) is provided too.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

Json = dict[str, Any]
SERVICE_ACCOUNT = "system:serviceaccount:kube-system:nvidia-driver-installer"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
_CODES = {"Forbidden": 403, "Invalid": 422, "Unauthorized": 401, "RequestEntityTooLarge": 413}


@dataclass(frozen=True)
class Denied:
    code: int
    reason: str
    message: str


@dataclass(frozen=True)
class Authorizer:
    """Answers authorization checks for the request's user: `allowed(verb, group, resource,
    namespace)`, with resource as RBAC names it (`pods/eviction`) and namespace "" for a check
    across every namespace (only cluster-wide grants answer it)."""

    allowed: Callable[[str, str, str, str], bool]


@dataclass(frozen=True)
class _Check:
    """A check being built: authorizer.group(g).resource(r)[.subresource(s)][.namespace(n)]..."""

    authorizer: Authorizer
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


@dataclass(frozen=True)
class _Decision:
    allowed: bool


def _kubernetes_functions() -> dict[str, Callable[..., Any]]:
    """The Authz library's methods and the strings library's join as cel-python functions (a
    method call `x.f(a)` is f(x, a))."""
    from celpy import celtypes

    def rebuild(**field: str) -> Callable[[_Check, Any], _Check]:
        (key,) = field
        return lambda check, value: replace(check, **{key: str(value)})

    def group(authorizer: Any, value: Any) -> _Check:
        if not isinstance(authorizer, Authorizer):
            raise TypeError("group() is a method of the authorizer")
        return _Check(authorizer, group=str(value))

    def check(target: _Check, verb: Any) -> _Decision:
        resource = target.resource + (f"/{target.subresource}" if target.subresource else "")
        return _Decision(target.authorizer.allowed(str(verb), target.group, resource,
                                                   target.namespace))

    return {
        "group": group,
        "resource": rebuild(resource=""),
        "subresource": rebuild(subresource=""),
        "namespace": rebuild(namespace=""),
        "name": rebuild(name=""),
        "check": check,
        "allowed": lambda decision: celtypes.BoolType(decision.allowed),
        "errored": lambda decision: celtypes.BoolType(False),
        "reason": lambda decision: celtypes.StringType(""),
        "join": lambda items, separator="": celtypes.StringType(
            str(separator).join(str(item) for item in items)),
    }


NOTHING_BOUND = Authorizer(lambda verb, group, resource, namespace: False)


def rbac_authorizer(rules: list[Json]) -> Authorizer:
    """RBAC's answer from the rules of the roles bound to the user (cluster.apiserver's
    cluster_role_rules: a Role's rules carry `_namespace`)."""

    def allowed(verb: str, group: str, resource: str, namespace: str) -> bool:
        return any(group in rule.get("apiGroups", []) and resource in rule.get("resources", [])
                   and verb in rule.get("verbs", [])
                   and rule.get("_namespace", namespace) == namespace for rule in rules)

    return Authorizer(allowed)


def load_policies(path: Path) -> list[tuple[Json, str]]:
    """(policy, name of its binding) for every bound policy in a manifest file."""
    import yaml

    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    bound = {d["spec"]["policyName"]: d["metadata"]["name"] for d in docs
             if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    return [(d, bound[d["metadata"]["name"]]) for d in docs
            if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] in bound]


NODE_UID = "6e1f6b62-0d0e-4a3b-9e1c-2b3c4d5e6f70"


def user_info(username: str = SERVICE_ACCOUNT, node: Optional[str] = None,
              node_uid: str = NODE_UID) -> Json:
    """What the API server puts in request.userInfo for a pod-bound ServiceAccount token
    (Kubernetes >= 1.30 adds the pod's node, its name and the uid the Node had when the token
    was issued, to `extra`)."""
    info: Json = {"username": username,
                  "uid": "0b6c5e52-6d1b-4c5e-9d1f-3a4b5c6d7e8f",
                  "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                             "system:authenticated"]}
    if node is not None:
        info["extra"] = {
            "authentication.kubernetes.io/credential-id": ["JTI=5d3c1e9a-1b2c-4d5e-8f90"],
            NODE_CLAIM: [node],
            "authentication.kubernetes.io/node-uid": [node_uid],
            "authentication.kubernetes.io/pod-name": ["nvidia-driver-installer-x2k9q"],
            "authentication.kubernetes.io/pod-uid": ["a1b2c3d4-e5f6-4789-8abc-def012345678"],
        }
    return info


def request(operation: str, resource: str, name: str, user: Json, *, namespace: str = "",
            subresource: str = "", obj: Optional[Json] = None,
            old: Optional[Json] = None) -> Json:
    """The admission request (and `object`, `oldObject`) for one API call."""
    kinds = {"nodes": "Node", "pods": "Pod", "events": "Event"}
    kind = "Eviction" if subresource == "eviction" else kinds[resource]
    group_version = ("policy", "v1") if kind == "Eviction" else ("", "v1")
    return {
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group_version[0], "version": group_version[1], "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": resource},
            "subResource": subresource,
            "requestKind": {"group": group_version[0], "version": group_version[1],
                            "kind": kind},
            "requestResource": {"group": "", "version": "v1", "resource": resource},
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": user,
            "dryRun": False,
        },
        "object": obj,
        "oldObject": old,
    }


def _matches(policy: Json, req: Json) -> bool:
    r = req["request"]
    resource = r["resource"]["resource"] + (f"/{r['subResource']}" if r["subResource"] else "")
    for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
        if (r["resource"]["group"] in rule["apiGroups"] and resource in rule["resources"]
                and (r["operation"] in rule["operations"] or "*" in rule["operations"])):
            return True
    return False


class _Failed:
    """A variable whose expression failed: using it fails."""


@functools.cache
def _program(expression: str) -> Any:
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(expression), functions=_kubernetes_functions())


def _evaluate(expression: str, activation: dict[str, Any]) -> Any:
    result = _program(expression).evaluate(activation)
    if isinstance(result, Exception):
        raise result
    return result


def check(policies: list[tuple[Json, str]], req: Json,
          authorizer: Authorizer = NOTHING_BOUND) -> Optional[Denied]:
    """None when every matching policy admits the request, else the first denial."""
    import celpy

    base: dict[str, Any] = {k: celpy.json_to_cel(v) for k, v in req.items()}
    base["authorizer"] = authorizer
    for policy, binding in policies:
        if not _matches(policy, req):
            continue
        name = policy["metadata"]["name"]
        prefix = f"ValidatingAdmissionPolicy '{name}' with binding '{binding}' denied request: "
        try:
            if not all(bool(_evaluate(c["expression"], base))
                       for c in policy["spec"].get("matchConditions", [])):
                continue
        except Exception as exc:  # failurePolicy Fail
            return Denied(403, "Forbidden", prefix + f"matchCondition failed: {exc}")
        variables: dict[str, Any] = {}
        for variable in policy["spec"].get("variables", []):
            try:
                variables[variable["name"]] = _evaluate(
                    variable["expression"], {**base, "variables": celpy.celtypes.MapType(
                        {celpy.celtypes.StringType(k): v for k, v in variables.items()
                         if not isinstance(v, _Failed)})})
            except Exception:
                variables[variable["name"]] = _Failed()
        activation = {**base, "variables": celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()
             if not isinstance(v, _Failed)})}
        for validation in policy["spec"]["validations"]:
            reason = validation.get("reason", "Invalid")
            try:
                ok = bool(_evaluate(validation["expression"], activation))
            except Exception as exc:
                return Denied(_CODES[reason], reason, prefix + f"expression "
                              f"'{validation['expression']}' resulted in error: {exc}")
            if ok:
                continue
            message = validation.get("message") or (
                f"failed expression: {validation['expression']}")
            if "messageExpression" in validation:
                with contextlib.suppress(Exception):  # the API server falls back to `message`
                    message = str(_evaluate(validation["messageExpression"], activation))
            return Denied(_CODES[reason], reason, prefix + " ".join(message.split()))
    return None
