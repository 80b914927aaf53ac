"""The pool policy (a version per node pool from one DaemonSet): parsing every bad input to its
own message, choosing a node's rule by its labels, the label file, and `installer plan` naming
the rule it took."""

from __future__ import annotations

from pathlib import Path

import pytest
from lib.cli import invoke
from lib.dnfplans import decision, plan_for
from lib.fakes import FakeRunner
from lib.hostkit import tree_snapshot
from lib.hosttrees import make_host, root_env

from installer.cluster import pools
from installer.errors import NodeLabelsUnavailable, PoolPolicyInvalid, PoolRulesConflict

POLICY = """\
# Two pools on two branches; every other GPU node takes the default.
rules:
  - name: training
    nodeSelector:
      matchLabels:
        cloud.google.com/gke-nodepool: training
    version: "R595"
    moduleType: open
    maxUpgrading: 2
  - name: inference
    nodeSelector:
      matchLabels:
        cloud.google.com/gke-nodepool: inference
        nvidia.com/gpu.family: hopper
    version: "580.105.08"
    source: runfile
  - name: everything-else
    default: true
    version: lts
"""


def policy(text: str = POLICY) -> pools.Policy:
    return pools.parse(text, "policy.yaml")


def test_a_policy_parses_in_order_with_its_settings() -> None:
    parsed = policy()
    assert [r.name for r in parsed.rules] == ["training", "inference", "everything-else"]
    training, inference, default = parsed.rules
    assert training.match == (("cloud.google.com/gke-nodepool", "training"),)
    assert (training.version, training.module_type, training.source,
            training.max_upgrading) == ("R595", "open", None, 2)
    assert (inference.version, inference.source, inference.max_upgrading) == (
        "580.105.08", "runfile", 1)
    assert parsed.default == default and default.match == ()


def test_a_node_takes_the_rule_all_of_whose_labels_it_carries() -> None:
    parsed = policy()
    pool = parsed.rules
    chosen = pools.choose(parsed, {"cloud.google.com/gke-nodepool": "training", "x": "y"}, "n1")
    assert chosen.rule == pool[0]
    assert chosen.reason == ("rule 'training' of policy.yaml: the node's labels match "
                             "cloud.google.com/gke-nodepool=training; version R595, "
                             "kernel-module-type open")
    # One label of two is not a match: the default.
    half = pools.choose(parsed, {"cloud.google.com/gke-nodepool": "inference"}, "n2")
    assert half.rule == pool[2]
    assert "the default of policy.yaml: no other rule's nodeSelector matches" in half.reason
    both = pools.choose(parsed, {"cloud.google.com/gke-nodepool": "inference",
                                 "nvidia.com/gpu.family": "hopper"}, "n3")
    assert both.rule == pool[1]


def test_a_node_two_rules_match_is_an_error_naming_both() -> None:
    text = POLICY.replace("cloud.google.com/gke-nodepool: training",
                          "nvidia.com/gpu.family: hopper")
    with pytest.raises(PoolRulesConflict) as conflict:
        pools.choose(policy(text), {"cloud.google.com/gke-nodepool": "inference",
                                    "nvidia.com/gpu.family": "hopper"}, "gpu-7")
    assert conflict.value.message == (
        "node gpu-7 is matched by two rules of the pool policy policy.yaml: 'training' "
        "(nvidia.com/gpu.family=hopper) and 'inference' (cloud.google.com/gke-nodepool="
        "inference,nvidia.com/gpu.family=hopper)")
    assert (conflict.value.reference, conflict.value.exit_code) == ("pool-rules-conflict", 82)


def test_without_a_default_an_unmatched_node_keeps_the_daemonsets_settings() -> None:
    text = POLICY[:POLICY.index("  - name: everything-else")]
    chosen = pools.choose(policy(text), {"kubernetes.io/hostname": "n"}, "n")
    assert chosen.rule is None
    assert "has no default: the DaemonSet's own settings" in chosen.reason


RULE = "rules:\n  - name: a\n    nodeSelector:\n      matchLabels:\n        pool: a\n"


@pytest.mark.parametrize(("text", "complaint"), [
    ("rules: [", "is not YAML"),
    ("- name: a\n", "the top level must be a mapping with one key, `rules`"),
    ("rules: []\n", "`rules` must be a non-empty list"),
    ("rules:\n  - 7\n", "rules[0] must be a mapping"),
    (RULE + "    verison: 595\n", "unknown key 'verison'"),
    ("rules:\n  - name: Big_Pool\n    default: true\n", "name 'Big_Pool' must be a DNS label"),
    (RULE + RULE[len("rules:\n"):], "two rules are named 'a'"),
    ("rules:\n  - name: x\n    default: true\n  - name: y\n    default: true\n",
     "rules 'x' and 'y' are both the default"),
    ("rules:\n  - name: x\n    default: yes please\n", "default must be true or false"),
    ("rules:\n  - name: x\n    default: true\n    nodeSelector: {matchLabels: {a: b}}\n",
     "it has no nodeSelector"),
    ("rules:\n  - name: x\n    version: '595'\n", "nodeSelector must hold `matchLabels` only"),
    ("rules:\n  - name: x\n    nodeSelector:\n      matchExpressions: []\n",
     "nodeSelector must hold `matchLabels` only"),
    ("rules:\n  - name: x\n    nodeSelector:\n      matchLabels: {}\n",
     "matchLabels must map label keys to values"),
    ("rules:\n  - name: x\n    nodeSelector:\n      matchLabels: {'bad key': a}\n",
     "'bad key' is not a label key"),
    ("rules:\n  - name: x\n    nodeSelector:\n      matchLabels: {gpu: true}\n",
     "the value True of gpu is not a label value (quote values"),
    (RULE + "    version: 595\n", "version 595 must be a string (quote numbers"),
    (RULE + "    version: '595.x'\n", "invalid driver version '595.x'"),
    (RULE + "    moduleType: closed\n", "moduleType 'closed' is not one of auto, open, "
                                       "proprietary"),
    (RULE + "    source: apt\n", "source 'apt' is not one of auto, runfile, dnf"),
    (RULE + "    maxUpgrading: 0\n", "maxUpgrading 0 must be a whole number, 1 or more"),
    (RULE + "    maxUpgrading: true\n", "maxUpgrading True must be a whole number"),
])
def test_every_bad_input_gets_its_own_message(text: str, complaint: str) -> None:
    with pytest.raises(PoolPolicyInvalid) as bad:
        pools.parse(text, "policy.yaml")
    assert complaint in bad.value.message
    assert bad.value.message.startswith("pool policy policy.yaml")
    assert (bad.value.reference, bad.value.exit_code) == ("pool-policy-invalid", 81)


def test_the_label_file_takes_lines_or_the_kubelets_comma_form(tmp_path: Path) -> None:
    labels = tmp_path / "labels"
    labels.write_text("# written by the node's bootstrap\ncloud.google.com/gke-nodepool="
                      "training\n\nnvidia.com/gpu.family=hopper,empty=\n")
    assert pools.read_label_file(labels) == {"cloud.google.com/gke-nodepool": "training",
                                             "nvidia.com/gpu.family": "hopper", "empty": ""}
    labels.write_text("pool training\n")
    with pytest.raises(NodeLabelsUnavailable, match="'pool training' is not key=value"):
        pools.read_label_file(labels)
    with pytest.raises(NodeLabelsUnavailable, match="could not be read: No such file"):
        pools.read_label_file(tmp_path / "absent")


def write(tmp_path: Path, text: str, labels: str) -> dict[str, str]:
    (tmp_path / "policy.yaml").write_text(text)
    (tmp_path / "labels").write_text(labels)
    return {"NVIDIA_INSTALLER_POOL_POLICY": str(tmp_path / "policy.yaml"),
            "NVIDIA_INSTALLER_NODE_LABELS_FILE": str(tmp_path / "labels")}


@pytest.mark.parametrize(("labels", "rule", "version", "flavour"), [
    ("cloud.google.com/gke-nodepool=training\n", "training", "595.91.07", "open"),
    ("cloud.google.com/gke-nodepool=inference\nnvidia.com/gpu.family=hopper\n", "inference",
     "580.105.08", "open"),
    ("cloud.google.com/gke-nodepool=other\n", "everything-else", "580.126.20", "open"),
])
def test_plan_names_the_rule_it_took_and_installs_its_version(
        tmp_path: Path, labels: str, rule: str, version: str, flavour: str) -> None:
    (tmp_path / "cm").mkdir()
    settings = write(tmp_path / "cm", POLICY, labels)
    # The DaemonSet's own version is another: the rule's takes its place.
    plan = plan_for(tmp_path / "host", FakeRunner(), distro="ubuntu-24.04",
                    kernel="6.8.0-87-generic", NVIDIA_DRIVER_VERSION="570", **settings)
    value, reason = decision(plan, "pool")
    assert value == rule
    assert f"rule {rule!r}" in reason and "policy.yaml" in reason
    assert (plan.context.target.version, plan.context.target.flavour) == (version, flavour)
    assert plan.decisions[0].topic == "pool"


def test_plan_with_no_matching_rule_and_no_default_says_so(tmp_path: Path) -> None:
    (tmp_path / "cm").mkdir()
    text = POLICY[:POLICY.index("  - name: everything-else")]
    settings = write(tmp_path / "cm", text, "pool=none\n")
    plan = plan_for(tmp_path / "host", FakeRunner(), distro="ubuntu-24.04",
                    kernel="6.8.0-87-generic", NVIDIA_DRIVER_VERSION="570", **settings)
    assert decision(plan, "pool")[0] == "none"
    assert plan.context.target.version.startswith("570.")


@pytest.mark.parametrize(("text", "labels", "code", "reference"), [
    (RULE + "    version: 595\n", "pool=a\n", 81, "pool-policy-invalid"),
    (RULE + RULE[len("rules:\n"):].replace("name: a", "name: b"), "pool=a\n", 82,
     "pool-rules-conflict"),
    (POLICY, "not a label\n", 83, "node-labels-unavailable"),
])
def test_a_bad_policy_or_label_file_stops_the_run_with_the_host_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        text: str, labels: str, code: int, reference: str) -> None:
    (tmp_path / "cm").mkdir()
    settings = write(tmp_path / "cm", text, labels)
    root = tmp_path / "host"
    make_host(root, distro="ubuntu-24.04", kernel="6.8.0-87-generic", gpus=[0x2330])
    before = tree_snapshot(root)
    assert invoke(monkeypatch, ["run"], root_env(root, **settings)) == code
    err = capsys.readouterr().err
    assert err.startswith(f"error[{reference}]: ") and "\nhint: " in err
    assert "Nothing on the node was changed" in err
    assert tree_snapshot(root) == before


def test_an_unreadable_policy_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "host"
    make_host(root, distro="ubuntu-24.04", kernel="6.8.0-87-generic", gpus=[0x2330])
    env = root_env(root, NVIDIA_INSTALLER_POOL_POLICY=str(tmp_path / "no-configmap"),
                   NVIDIA_INSTALLER_NODE_LABELS_FILE=str(tmp_path / "labels"))
    assert invoke(monkeypatch, ["plan"], env) == 81
    assert (f"error[pool-policy-invalid]: pool policy {tmp_path / 'no-configmap'} could not be "
            "read: No such file or directory") in capsys.readouterr().err


def test_without_a_label_file_or_node_name_the_labels_are_unavailable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    root = tmp_path / "host"
    make_host(root, distro="ubuntu-24.04", kernel="6.8.0-87-generic", gpus=[0x2330])
    env = root_env(root, NVIDIA_INSTALLER_POOL_POLICY=str(tmp_path / "policy.yaml"))
    assert invoke(monkeypatch, ["plan"], env) == 83
    assert "NODE_NAME is not either, so the Node cannot be read" in capsys.readouterr().err


def test_the_upgrade_protocol_gets_the_pool_whose_budget_it_keeps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from installer.cluster import protocol, upgrade_gate

    (tmp_path / "cm").mkdir()
    settings = write(tmp_path / "cm", POLICY, "cloud.google.com/gke-nodepool=training\n")
    plan = plan_for(tmp_path / "host", FakeRunner(), distro="ubuntu-24.04",
                    kernel="6.8.0-87-generic", NVIDIA_INSTALLER_UPGRADE_PROTOCOL="true",
                    NODE_NAME="gpu-1", **settings)
    gate = plan.context.upgrade_gate
    assert isinstance(gate, upgrade_gate.ClusterGate)
    assert gate.pool is not None and gate.pool.rule is not None
    assert (gate.pool.rule.name, gate.pool.rule.max_upgrading) == ("training", 2)
    seen: list[object] = []
    monkeypatch.setattr(protocol, "make_room", lambda *args, **kwargs: seen.append(kwargs))
    gate.free_driver(plan.context, ["nvidia-device-plugin"], "580.105.08", "595.91.07")
    assert seen == [{"pool": gate.pool}]
