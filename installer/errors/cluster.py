"""The Kubernetes API server's answers to the upgrade protocol and the scheduling gate
(installer/cluster)."""

from __future__ import annotations

from installer.errors.base import InstallerError


class ClusterApiUnavailable(InstallerError):
    reference = "cluster-api-unavailable"
    exit_code = 70
    default_hint = (
        "The installer could not talk to the Kubernetes API server; check the node's network "
        "and NVIDIA_INSTALLER_KUBECONFIG (or the pod's service account). Nothing on the node "
        "was changed by this attempt; the pod retries."
    )


class KubeconfigInvalid(ClusterApiUnavailable):
    """A kubeconfig field of the wrong type or shape: refused before any request is made."""

    reference = "kubeconfig-invalid"
    exit_code = 100
    default_hint = (
        "Fix the kubeconfig named above (NVIDIA_INSTALLER_KUBECONFIG) as the message says: "
        "kubectl refuses it too (`kubectl --kubeconfig <file> get node <node>` checks it). "
        "Nothing on the node was changed."
    )


class ClusterApiForbidden(InstallerError):
    reference = "cluster-api-forbidden"
    exit_code = 71
    default_hint = (
        "The API server refused the request: apply the upgrade protocol's Component "
        "(daemonset/components/upgrade-protocol: RBAC, token, admission policy), and "
        "check that the installer writes only to its own node (the message names the policy)."
    )


class NodeNotFound(InstallerError):
    reference = "node-not-found"
    exit_code = 72
    default_hint = (
        "NODE_NAME must be this node's name: set it from the downward API (fieldRef "
        "spec.nodeName)."
    )


class EvictionTimeout(InstallerError):
    reference = "eviction-timeout"
    exit_code = 73
    default_hint = (
        "GPU pods named above did not leave in time (a PodDisruptionBudget or a pod that does "
        "not terminate). The node was uncordoned and its labels restored if the installer had "
        "changed them; the old driver keeps working. Move the pods or relax the budget, raise "
        "NVIDIA_INSTALLER_EVICTION_TIMEOUT, or set NVIDIA_INSTALLER_FORCE_EVICTION=true."
    )


class DriverHoldersTimeout(InstallerError):
    reference = "driver-holders-timeout"
    exit_code = 74
    default_hint = (
        "Processes named above kept /dev/nvidia* open after the GPU pods left (a DaemonSet pod "
        "that does not follow nvidia.com/gpu.deploy.<component> labels, or a host process). "
        "The node was restored; stop them, add their component to "
        "NVIDIA_INSTALLER_PAUSE_COMPONENTS, or raise NVIDIA_INSTALLER_HOLDERS_TIMEOUT."
    )


class UpgradeAnnotationInvalid(InstallerError):
    reference = "upgrade-annotation-invalid"
    exit_code = 89
    default_hint = (
        "The node's nvidia-driver-installer/upgrade annotation is not what the installer "
        "writes. Look at it (`kubectl get node <node> -o yaml`), restore the node by hand "
        "(uncordon, the nvidia.com/gpu.deploy.* labels) and remove the annotation "
        "(`kubectl annotate node <node> nvidia-driver-installer/upgrade-`)."
    )


class SchedulingGateUnavailable(ClusterApiUnavailable):
    """The API server did not answer while the node's scheduling gate was opened or
    closed."""

    reference = "scheduling-gate-unavailable"
    exit_code = 110
    default_hint = (
        "The node keeps its scheduling-gate taint (NVIDIA_INSTALLER_GATE_TAINT) until a run or "
        "the scheduling-gate container reaches the API server again; before an unload, nothing "
        "was unloaded. Check the node's network and the pod's service account "
        "(daemonset/components/scheduling-gate); the pod retries."
    )


class SchedulingGateForbidden(ClusterApiForbidden):
    """The API server refused a change of the node's scheduling gate."""

    reference = "scheduling-gate-forbidden"
    exit_code = 111
    default_hint = (
        "Apply daemonset/components/scheduling-gate (its RBAC and admission policy), and keep "
        "the policy's gateTaintKey equal to NVIDIA_INSTALLER_GATE_TAINT (docs/deploy.md, "
        "\"The scheduling gate\"). The node keeps its taint."
    )


class NodeConditionForbidden(InstallerError):
    """The API server refused the NvidiaDriverReady condition or an Event: RBAC or policy."""

    reference = "node-condition-forbidden"
    exit_code = 101
    default_hint = (
        "Apply daemonset/components/cluster-signals (its role grants nodes/status patch and "
        "events create, its admission policy admits only this node's NvidiaDriverReady "
        "condition), or set NVIDIA_INSTALLER_CLUSTER_SIGNALS=false. The driver itself is "
        "installed and unaffected."
    )


class PoolPolicyInvalid(InstallerError):
    reference = "pool-policy-invalid"
    exit_code = 81
    default_hint = (
        "Fix the pool policy ConfigMap as the message says (docs/deploy.md, \"A version per node "
        "pool\"); `installer plan` on a node shows the rule it takes. Nothing on the node was "
        "changed."
    )


class PoolRulesConflict(InstallerError):
    reference = "pool-rules-conflict"
    exit_code = 82
    default_hint = (
        "Make the two rules' nodeSelectors exclusive (a label only one pool carries), or drop "
        "one rule. Nothing on the node was changed."
    )


class NodeLabelsUnavailable(InstallerError):
    reference = "node-labels-unavailable"
    exit_code = 83
    default_hint = (
        "The pool policy needs the node's labels: mount a label file and name it in "
        "NVIDIA_INSTALLER_NODE_LABELS_FILE, or give the pod NODE_NAME and a token that may get "
        "its Node (components/upgrade-protocol). Nothing on the node was changed."
    )


class PoolBudgetTimeout(InstallerError):
    reference = "pool-budget-timeout"
    exit_code = 84
    default_hint = (
        "Other nodes of this pool stayed mid-upgrade for NVIDIA_INSTALLER_POOL_WAIT_TIMEOUT "
        "seconds (their nvidia-driver-installer/upgrade-state label): look at them, or raise "
        "the rule's maxUpgrading. The node keeps its driver and is not cordoned; the pod "
        "retries."
    )
