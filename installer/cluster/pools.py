"""A driver version per node pool from one DaemonSet: the pool policy (a mounted ConfigMap
file: ordered rules, a node selector each, one default) resolved against this node's own labels,
read from a label file or with the pod's token from the API server."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from installer.config import Config
from installer.errors import (
    InvalidVersion,
    NodeLabelsUnavailable,
    PoolBudgetTimeout,
    PoolPolicyInvalid,
    PoolRulesConflict,
)

log = logging.getLogger(__name__)

_RULE_KEYS = ("name", "nodeSelector", "default", "version", "moduleType", "source",
              "maxUpgrading")
_MODULE_TYPES = ("auto", "open", "proprietary")
_SOURCES = ("auto", "runfile", "dnf")
# Kubernetes' label syntax (k8s.io/apimachinery validation): an optional DNS-subdomain prefix
# and a name of at most 63 characters; values are names or empty.
_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
_KEY_RE = re.compile(rf"(?a)^(?:{_PREFIX}/)?{_NAME}$")
_VALUE_RE = re.compile(rf"(?a)^(?:{_NAME})?$")
# A rule's name is a label value (POOL_LABEL) and a DNS label, so it reads well in both.
_RULE_NAME_RE = re.compile(r"(?a)^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")


class Rule(NamedTuple):
    """One pool: the labels a node must carry (all of them), and what its nodes install."""

    name: str
    match: tuple[tuple[str, str], ...]
    default: bool = False
    version: str | None = None
    module_type: str | None = None
    source: str | None = None
    max_upgrading: int = 1

    def selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.match) or "(default)"

    def settings(self) -> str:
        given = [("version", self.version), ("kernel-module-type", self.module_type),
                 ("source", self.source)]
        return ", ".join(f"{k} {v}" for k, v in given if v is not None) or "no setting"


class Policy(NamedTuple):
    rules: tuple[Rule, ...]
    where: str

    @property
    def default(self) -> Rule | None:
        return next((r for r in self.rules if r.default), None)


class Pool(NamedTuple):
    """The rule this node takes (None: no rule and no default), why, and the whole policy
    (the budget tells the pool's other nodes by it)."""

    rule: Rule | None
    reason: str
    policy: Policy


def parse(text: str, where: str) -> Policy:
    """A Policy from the ConfigMap file's YAML (or JSON). Raises PoolPolicyInvalid naming the
    rule and key at fault."""
    import yaml

    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PoolPolicyInvalid(f"pool policy {where} is not YAML: {exc}") from exc
    entries = _sole_key(document, "rules", f"pool policy {where}: the top level must be a "
                        "mapping with one key, `rules` (an ordered list)")
    if not isinstance(entries, list) or not entries:
        raise PoolPolicyInvalid(f"pool policy {where}: `rules` must be a non-empty list")
    rules = [_rule(where, index, entry) for index, entry in enumerate(entries)]
    names = [r.name for r in rules]
    for name in names:
        if names.count(name) > 1:
            raise PoolPolicyInvalid(f"pool policy {where}: two rules are named {name!r}")
    defaults = [r.name for r in rules if r.default]
    if len(defaults) > 1:
        raise PoolPolicyInvalid(f"pool policy {where}: rules {defaults[0]!r} and "
                                f"{defaults[1]!r} are both the default; one default at most")
    return Policy(tuple(rules), where)


def _sole_key(value: Any, key: str, otherwise: str) -> Any:
    """`value[key]` where `value` is a mapping that holds `key` and nothing else; raises
    PoolPolicyInvalid saying `otherwise` for anything else."""
    if not isinstance(value, dict) or set(value) != {key}:
        raise PoolPolicyInvalid(otherwise)
    return value[key]


def _rule(where: str, index: int, entry: Any) -> Rule:
    at = f"pool policy {where}, rules[{index}]"
    if not isinstance(entry, dict):
        raise PoolPolicyInvalid(f"{at} must be a mapping")
    unknown = sorted(str(k) for k in entry if k not in _RULE_KEYS)
    if unknown:
        raise PoolPolicyInvalid(f"{at}: unknown key {unknown[0]!r} (known: "
                                f"{', '.join(_RULE_KEYS)})")
    name = entry.get("name")
    if not isinstance(name, str) or not _RULE_NAME_RE.match(name):
        raise PoolPolicyInvalid(f"{at}: name {name!r} must be a DNS label (a-z, 0-9, '-', at "
                                "most 63 characters): it becomes the node's pool label")
    at = f"pool policy {where}, rule {name!r}"
    default = entry.get("default", False)
    if not isinstance(default, bool):
        raise PoolPolicyInvalid(f"{at}: default must be true or false")
    match = _match_labels(at, entry.get("nodeSelector"), default)
    version = _choice(at, entry, "version", None)
    if version is not None:
        from installer.release import versions

        try:
            versions.parse_request(version)
        except InvalidVersion as exc:
            raise PoolPolicyInvalid(f"{at}: {exc.message} (an exact version, a branch such as "
                                    "R595, or auto, latest, production, lts)") from exc
    budget = entry.get("maxUpgrading", 1)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise PoolPolicyInvalid(f"{at}: maxUpgrading {budget!r} must be a whole number, 1 or "
                                "more (nodes of the pool upgrading at once)")
    return Rule(name, match, default, version,
                _choice(at, entry, "moduleType", _MODULE_TYPES),
                _choice(at, entry, "source", _SOURCES), budget)


def _match_labels(at: str, selector: Any, default: bool) -> tuple[tuple[str, str], ...]:
    if default:
        if selector not in (None, {}):
            raise PoolPolicyInvalid(f"{at}: the default rule takes every node no other rule "
                                    "matches; it has no nodeSelector")
        return ()
    labels = _sole_key(selector, "matchLabels", f"{at}: nodeSelector must hold `matchLabels` "
                       "only (a rule without one would match every node: use `default: true`)")
    if not isinstance(labels, dict) or not labels:
        raise PoolPolicyInvalid(f"{at}: nodeSelector.matchLabels must map label keys to values")
    for key, value in labels.items():
        if not isinstance(key, str) or not _KEY_RE.match(key) or len(key) > 317:
            raise PoolPolicyInvalid(f"{at}: {key!r} is not a label key")
        if not isinstance(value, str) or not _VALUE_RE.match(value):
            raise PoolPolicyInvalid(f"{at}: the value {value!r} of {key} is not a label value "
                                    "(quote values such as \"true\" or \"595\")")
    return tuple(sorted(labels.items()))


def _choice(at: str, entry: dict[str, Any], key: str,
            allowed: tuple[str, ...] | None) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    if allowed is None and not isinstance(value, str):
        raise PoolPolicyInvalid(f"{at}: {key} {value!r} must be a string (quote numbers: "
                                "\"595\")")
    if allowed is not None and value not in allowed:
        raise PoolPolicyInvalid(f"{at}: {key} {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def choose(policy: Policy, labels: Mapping[str, str], node: str) -> Pool:
    """The rule whose matchLabels this node's labels all carry; the default when none does.
    Raises PoolRulesConflict when two rules match (both named)."""
    matched = [r for r in policy.rules if not r.default and r.match
               and all(labels.get(k) == v for k, v in r.match)]
    if len(matched) > 1:
        first, second = matched[0], matched[1]
        raise PoolRulesConflict(
            f"node {node} is matched by two rules of the pool policy {policy.where}: "
            f"{first.name!r} ({first.selector()}) and {second.name!r} ({second.selector()})")
    if matched:
        rule = matched[0]
        return Pool(rule, f"rule {rule.name!r} of {policy.where}: the node's labels match "
                          f"{rule.selector()}; {rule.settings()}", policy)
    default = policy.default
    if default is not None:
        return Pool(default, f"rule {default.name!r}, the default of {policy.where}: no other "
                             f"rule's nodeSelector matches the node's labels; "
                             f"{default.settings()}", policy)
    return Pool(None, f"no rule of {policy.where} matches the node's labels and it has no "
                      "default: the DaemonSet's own settings", policy)


def node_labels(config: Config) -> dict[str, str]:
    """This node's labels: the label file when set, else the Node object read with the pod's
    credentials. Reads a file or the API server; raises NodeLabelsUnavailable, ClusterApi*."""
    if config.node_labels_file:
        return read_label_file(Path(config.node_labels_file))
    if not config.node_name:
        raise NodeLabelsUnavailable(
            "the pool policy needs this node's labels: NVIDIA_INSTALLER_NODE_LABELS_FILE is "
            "not set and NODE_NAME is not either, so the Node cannot be read")
    from installer.cluster.client import NodeClient

    node = NodeClient(config.node_name, config.kubeconfig).get_node()
    labels = (node.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def read_label_file(path: Path) -> dict[str, str]:
    """`key=value` lines (# comments and blank lines skipped) or the kubelet's comma-separated
    --node-labels form. Raises NodeLabelsUnavailable naming the file and the bad entry."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise NodeLabelsUnavailable(f"node label file {path} could not be read: "
                                    f"{getattr(exc, 'strerror', None) or exc}") from exc
    labels: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for item in line.split(","):
            key, sep, value = item.strip().partition("=")
            key, value = key.strip(), value.strip().strip('"')
            if not sep or not _KEY_RE.match(key) or not _VALUE_RE.match(value):
                raise NodeLabelsUnavailable(f"node label file {path}: {item.strip()[:100]!r} "
                                            "is not key=value with a label key and value")
            labels[key] = value
    return labels


def load(config: Config) -> Policy:
    """The policy file named by NVIDIA_INSTALLER_POOL_POLICY. Raises PoolPolicyInvalid."""
    path = Path(config.pool_policy or "")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PoolPolicyInvalid(f"pool policy {path} could not be read: "
                                f"{getattr(exc, 'strerror', None) or exc}") from exc
    return parse(text, str(path))


def apply(config: Config) -> tuple[Config, Pool]:
    """`config` with the settings of this node's rule in place of the DaemonSet's. Reads the
    policy file and the node's labels; changes nothing. Raises PoolPolicyInvalid,
    PoolRulesConflict, NodeLabelsUnavailable, ClusterApi* errors."""
    policy = load(config)
    labels = node_labels(config)
    pool = choose(policy, labels, config.node_name or "(this node)")
    rule = pool.rule
    if rule is None:
        return config, pool
    changes: dict[str, Any] = {}
    if rule.version is not None:
        changes["version"] = rule.version
    if rule.module_type is not None:
        changes["module_type"] = rule.module_type
    if rule.source is not None:
        changes["source"] = rule.source
    log.info("pool policy: %s", pool.reason)
    return dataclasses.replace(config, **changes), pool


# --- the pool's upgrade budget (maxUpgrading) ----------------------------------------------

# The upgrade protocol's states (protocol.STATE_LABEL) of a node whose driver is being replaced;
# "queued-<ms since the epoch>" is a node waiting for its pool's budget.
BUSY = ("draining", "waiting-for-holders", "unloading")
QUEUED = "queued-"


def in_pool(policy: Policy, rule: Rule, labels: Mapping[str, str], node: str) -> bool:
    """Whether `node` (by its labels) takes `rule`; a node two rules match is in neither."""
    try:
        return choose(policy, labels, node).rule == rule
    except PoolRulesConflict:
        return False


def wait_for_turn(api: Any, policy: Policy, rule: Rule, state_label: str, timeout: float,
                  poll: float) -> None:
    """Queue this node for its pool and return once fewer than `rule.max_upgrading` nodes of
    the pool are upgrading or queued ahead of it (ordered by queue time, then name: every node
    reads the same labels, so they agree). Writes this node's state label; raises
    PoolBudgetTimeout (the label taken off again) or ClusterApi* errors."""
    stamp = int(time.time() * 1000)
    mine = (stamp, api.node)
    api.patch_node({"metadata": {"labels": {state_label: f"{QUEUED}{stamp}"}}})
    deadline = time.monotonic() + timeout
    said = False
    while True:
        ahead: list[str] = []
        for node in api.nodes_labelled(state_label):
            meta = node.get("metadata") or {}
            name = str(meta.get("name", ""))
            labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
            if name == api.node or not in_pool(policy, rule, labels, name):
                continue
            state = labels.get(state_label, "")
            queued = _queued_at(state)
            # A queue entry older than the wait itself is a run that died waiting: not ahead.
            if state in BUSY or (queued is not None and (queued, name) < mine
                                 and queued > stamp - timeout * 1000):
                ahead.append(f"{name} ({state})")
        if len(ahead) < rule.max_upgrading:
            if said:
                log.info("pool %s: my turn (maxUpgrading %d)", rule.name, rule.max_upgrading)
            return
        if not said:
            log.info("pool %s: waiting, maxUpgrading %d: %s", rule.name, rule.max_upgrading,
                     ", ".join(sorted(ahead)))
            said = True
        if time.monotonic() >= deadline:
            api.patch_node({"metadata": {"labels": {state_label: None}}})
            raise PoolBudgetTimeout(
                f"pool {rule.name!r}: {len(ahead)} node(s) upgrading or queued ahead "
                f"({', '.join(sorted(ahead))}) for {timeout:g} s, its maxUpgrading is "
                f"{rule.max_upgrading}: node {api.node} was not cordoned")
        time.sleep(poll)


def _queued_at(state: str) -> int | None:
    if state.startswith(QUEUED) and state[len(QUEUED):].isdigit():
        return int(state[len(QUEUED):])
    return None
