"""The run's settings, each named once: its Config field and type, environment variable, CLI
flag, default, meaning and parser in one entry (GKE's variable names first); the rules between
settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import Any, Callable, NamedTuple

from installer import setting_parsers
from installer.errors import ConfigError
from installer.setting_parsers import check_build_path

__all__ = ["SETTINGS", "Config", "Setting", "build_config", "check_build_path", "from_env",
           "known_env_vars", "secret_env_vars", "setting", "settings_of"]


class Setting(NamedTuple):
    """One setting: its Config field, environment variable, default (as the variable would
    spell it), meaning, and the parser that turns text into the field's value."""

    name: str
    env: str
    default: str
    help: str
    parse: Callable[[str, Setting], object]
    flag_is_switch: bool = False
    # A credential: no command-line flag (ps shows argv), out of repr, and kept out of every
    # child process's environment (installer.runner).
    secret: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def setting(env: str, default: str, parser: Callable[[str, Setting], object], help: str, *,
            switch: bool = False, secret: bool = False) -> Any:
    """A Config field for one setting: its default value is what `parser` makes of `default`;
    a `secret` value stays out of repr (and so out of logs)."""
    spec = Setting("", env, default, help, parser, switch, secret)
    return field(default=parser(default, spec), repr=not secret, metadata={"setting": spec})


@dataclass(frozen=True)
class Config:
    """Every setting of a run. One entry each: `name: type = setting(variable, default, parser,
    meaning)`; SETTINGS, the CLI flags and the settings table in docs/settings.md are derived
    from these entries."""

    root: Path = setting(
        "ROOT_MOUNT_DIR", "/", setting_parsers.root,
        "Where the host's / is mounted (GKE: /root).",
    )
    version: str = setting(
        "NVIDIA_DRIVER_VERSION", "auto", setting_parsers.version,
        "Exact version (550.54.15), branch (550, R550) or alias (auto, latest, production, lts).",
    )
    branch_path: str = setting(
        "NVIDIA_DRIVER_BRANCH", "tesla", setting_parsers.branch_path,
        "Path element of the default download URL (GKE's meaning).",
    )
    download_url: str | None = setting(
        "NVIDIA_DRIVER_DOWNLOAD_URL", "", setting_parsers.url,
        "Full URL of the .run (http, https or file://); overrides the default URL.",
    )
    sha256: str | None = setting(
        "NVIDIA_DRIVER_SHA256", "", setting_parsers.sha256,
        "Expected SHA-256 of the .run; otherwise its NVIDIA_DRIVER_DIGESTS_FILE entry, or the "
        ".sha256sum beside it on a trusted origin (https).",
    )
    mirrors: tuple[str, ...] = setting(
        "NVIDIA_DRIVER_MIRRORS", "", setting_parsers.mirrors,
        "Comma-separated base URLs tried before the default; each holds <version>/<runfile>.",
    )
    install_dir_host: PurePosixPath = setting(
        "NVIDIA_INSTALL_DIR_HOST", "/var/lib/nvidia", setting_parsers.required_host_path,
        "Install dir as the host sees it (GKE DaemonSets: /home/kubernetes/bin/nvidia).",
    )
    install_dir_container: Path = setting(
        "NVIDIA_INSTALL_DIR_CONTAINER", "/usr/local/nvidia", setting_parsers.container_path,
        "The same dir as mounted in the installer container.",
    )
    source: str = setting(
        "NVIDIA_DRIVER_SOURCE", "auto", setting_parsers.choice("auto", "runfile", "dnf"),
        "auto, runfile or dnf.",
    )
    module_type: str = setting(
        "NVIDIA_KERNEL_MODULE_TYPE", "auto", setting_parsers.choice("auto", "open", "proprietary"),
        "Kernel module flavour: auto, open or proprietary.",
    )
    track: str = setting(
        "NVIDIA_DRIVER_TRACK", "lts", setting_parsers.choice("lts", "production"),
        "Branch type `auto` picks from: lts or production.",
    )
    kernel_release: str | None = setting(
        "NVIDIA_KERNEL_RELEASE", "", setting_parsers.kernel_release,
        "Build for this kernel instead of the running one (building ahead; nothing is loaded).",
    )
    module_args: tuple[tuple[str, str], ...] = setting(
        "NVIDIA_MODULE_ARGS", "", setting_parsers.module_args,
        "Extra module parameters, space-separated module.param=value (e.g. "
        "nvidia.NVreg_EnableGpuFirmware=0).",
    )
    signing_key: PurePosixPath | None = setting(
        "NVIDIA_MODULE_SIGNING_KEY", "", setting_parsers.host_abs_path,
        "Private key (host path) to sign modules for Secure Boot; needs the certificate too.",
    )
    signing_cert: PurePosixPath | None = setting(
        "NVIDIA_MODULE_SIGNING_CERT", "", setting_parsers.host_abs_path,
        "Public certificate (host path, DER or PEM) matching the signing key.",
    )
    cache_dir: PurePosixPath | None = setting(
        "NVIDIA_INSTALLER_CACHE_DIR", "", setting_parsers.build_path,
        "Host path for downloads and compiled modules (default: <install dir>/cache).",
    )
    catalog: str | None = setting(
        "NVIDIA_DRIVER_CATALOG", "", setting_parsers.optional_text,
        "Version catalog in NVIDIA's releases.json shape: a path or URL (default: shipped).",
    )
    dnf_repo_url: str | None = setting(
        "NVIDIA_DNF_REPO_URL", "", setting_parsers.url,
        "dnf repo file URL (https:// or file://) for the RHEL family and Amazon Linux 2023 "
        "(default: NVIDIA's cuda-rhel<N>.repo or cuda-amzn2023.repo).",
    )
    fetch_headers: str = setting(
        "NVIDIA_INSTALLER_FETCH_HEADERS", "auto", setting_parsers.choice("auto", "true", "false"),
        "Fetch missing kernel headers from the host's package sources (or the headers mirror) "
        "into the cache: auto or true (yes), false (no).",
    )
    compiler_packages: Path | None = setting(
        "NVIDIA_INSTALLER_COMPILER_PACKAGES",
        "/usr/share/nvidia-driver-installer/compiler-packages", setting_parsers.local_file,
        "The image's list of gcc packages its own package sources offer (`<major> <package> "
        "<gcc path>` a line; our images' build writes it): the kernel's gcc major is installed "
        "from it when the image lacks it. Absent (a run on a host) or empty: never installed.",
    )
    retries: int = setting(
        "NVIDIA_INSTALLER_RETRIES", "5", setting_parsers.count,
        "Download attempts per mirror.",
    )
    connect_timeout: float = setting(
        "NVIDIA_INSTALLER_CONNECT_TIMEOUT", "10", setting_parsers.number,
        "Seconds to wait for a download connection.",
    )
    read_timeout: float = setting(
        "NVIDIA_INSTALLER_READ_TIMEOUT", "60", setting_parsers.number,
        "Seconds a download may stall before it is retried.",
    )
    lock_timeout: float = setting(
        "NVIDIA_INSTALLER_LOCK_TIMEOUT", "600", setting_parsers.number,
        "Seconds to wait for another installer's host lock before failing.",
    )
    allow_no_gpu: bool = setting(
        "NVIDIA_INSTALLER_ALLOW_NO_GPU", "false", setting_parsers.switch,
        "Install even when no NVIDIA GPU is found (modules are built, not loaded).",
        switch=True,
    )
    allow_64k_page_risk: bool = setting(
        "NVIDIA_INSTALLER_ALLOW_64K_PAGE_RISK", "false", setting_parsers.switch,
        "Install a 590.44.01 or later driver on a 64k-page arm64 kernel although those fault "
        "(Xid 31) on GPU mappings of 4 GiB or more (open-gpu-kernel-modules #1269).",
        switch=True,
    )
    allow_below_floor: bool = setting(
        "NVIDIA_INSTALLER_ALLOW_BELOW_FLOOR", "false", setting_parsers.switch,
        "Install an explicitly requested driver although a floor of this host (kernel, OS "
        "release, module flavour or GPU; docs/supported-hosts.md) says it cannot build or "
        "drive it.",
        switch=True,
    )
    log_format: str = setting(
        "NVIDIA_INSTALLER_LOG_FORMAT", "text", setting_parsers.choice("text", "json"),
        "text or json.",
    )
    termination_log: str = setting(
        "NVIDIA_INSTALLER_TERMINATION_LOG", "/dev/termination-log", setting_parsers.text,
        "Where a failure's reference and hint are written for `kubectl describe pod` (only if the"
        " file exists, as Kubernetes creates it).",
    )
    # where the driver comes from and who vouches for it; the prebuilt-module registry
    allow_unverified: bool = setting(
        "NVIDIA_DRIVER_ALLOW_UNVERIFIED", "false", setting_parsers.switch,
        "Accept a downloaded .run or Fabric Manager archive that no SHA-256 (pin, digests file "
        "or trusted origin) vouches for.",
        switch=True,
    )
    digests_file: Path | None = setting(
        "NVIDIA_DRIVER_DIGESTS_FILE", "", setting_parsers.local_file,
        "File of `<sha256>  <file name>  [<size>]` lines (a mounted ConfigMap; `installer "
        "download --dest` writes one) vouching for the .run and Fabric Manager archive by name.",
    )
    trusted_origins: tuple[str, ...] = setting(
        "NVIDIA_DRIVER_TRUSTED_ORIGINS",
        "https://download.nvidia.com,https://us.download.nvidia.com,"
        "https://developer.download.nvidia.com", setting_parsers.trusted_origins,
        "Comma-separated https://host[:port] origins whose .sha256sum and redistrib JSON "
        "(fetched over TLS) vouch for a file; a mirror elsewhere serves bytes only.",
    )
    module_registry: str | None = setting(
        "NVIDIA_MODULE_REGISTRY", "", setting_parsers.registry,
        "OCI repository (host[:port]/path) holding prebuilt kernel modules; `run` pulls a "
        "matching artifact instead of compiling. Unset: always compile.",
    )
    module_registry_plain_http: bool = setting(
        "NVIDIA_MODULE_REGISTRY_PLAIN_HTTP", "false", setting_parsers.switch,
        "Talk to the module registry over plain HTTP (a registry without TLS).",
        switch=True,
    )
    module_registry_push: bool = setting(
        "NVIDIA_MODULE_REGISTRY_PUSH", "false", setting_parsers.switch,
        "Publish modules this node compiled to the module registry (needs the registry, push "
        "credentials and NVIDIA_MODULE_PUBLISHER_KEY; a builder's job, not a node's).",
        switch=True,
    )
    module_registry_username: str | None = setting(
        "NVIDIA_MODULE_REGISTRY_USERNAME", "", setting_parsers.optional_text,
        "User name for the module registry (from a Kubernetes Secret).",
        secret=True,
    )
    module_registry_password: str | None = setting(
        "NVIDIA_MODULE_REGISTRY_PASSWORD", "", setting_parsers.optional_text,
        "Password or token for the module registry (from a Kubernetes Secret; never logged). "
        "Environment only; prefer NVIDIA_MODULE_REGISTRY_PASSWORD_FILE.",
        secret=True,
    )
    # kernel headers on nodes without the distro's archive
    headers_mirror: str | None = setting(
        "NVIDIA_INSTALLER_HEADERS_MIRROR", "", setting_parsers.url,
        "Mirror of the host's package archive for kernel headers (air-gapped nodes): replaces the"
        " URI of every apt source (suites, components, keys kept), or each dnf repo's baseurl "
        "with <mirror>/<repo id>/ (reposync's layout).",
    )
    rocky_vault: str = setting(
        "NVIDIA_INSTALLER_ROCKY_VAULT", "https://dl.rockylinux.org/vault/rocky",
        setting_parsers.url_or_empty,
        "Rocky Linux's vault: kernel-devel of older minor releases (<vault>/<minor>/BaseOS and "
        "AppStream).",
    )
    # the dnf source
    dnf_enable_epel: bool = setting(
        "NVIDIA_DNF_ENABLE_EPEL", "false", setting_parsers.switch,
        "dnf source, DKMS streams: install epel-release (from the host's repos) when no EPEL repo"
        " is enabled, for `dkms`. Off: adding a third-party repo is the operator's call.",
        switch=True,
    )
    # the node-side upgrade protocol (installer/cluster)
    upgrade_protocol: bool = setting(
        "NVIDIA_INSTALLER_UPGRADE_PROTOCOL", "false", setting_parsers.switch,
        "When a different, held driver is loaded: cordon, pause GPU clients, evict GPU pods, "
        "upgrade, restore (needs NODE_NAME and the API; see docs/deploy.md).",
        switch=True,
    )
    node_name: str | None = setting(
        "NODE_NAME", "", setting_parsers.node_name,
        "This node's name (the DaemonSet sets it from the downward API spec.nodeName).",
    )
    kubeconfig: str | None = setting(
        "NVIDIA_INSTALLER_KUBECONFIG", "", setting_parsers.optional_text,
        "kubeconfig file for the API server: a token, token file or client certificate (exec "
        "plugins are refused); default: the pod's service account.",
    )
    eviction_timeout: float = setting(
        "NVIDIA_INSTALLER_EVICTION_TIMEOUT", "600", setting_parsers.number,
        "Seconds GPU pods may take to leave (PodDisruptionBudgets honoured) before failing.",
    )
    holders_timeout: float = setting(
        "NVIDIA_INSTALLER_HOLDERS_TIMEOUT", "300", setting_parsers.number,
        "Seconds to wait, after the pods left, for every process to close /dev/nvidia*.",
    )
    force_eviction: bool = setting(
        "NVIDIA_INSTALLER_FORCE_EVICTION", "false", setting_parsers.switch,
        "Delete GPU pods still there at the eviction timeout, bypassing their "
        "PodDisruptionBudgets.",
        switch=True,
    )
    pause_components: tuple[str, ...] = setting(
        "NVIDIA_INSTALLER_PAUSE_COMPONENTS",
        "device-plugin,gpu-feature-discovery,dcgm-exporter,dcgm,mig-manager,dra-driver",
        setting_parsers.components,
        "Components <c> whose nvidia.com/gpu.deploy.<c> label is set to paused-for-driver-upgrade"
        " during an upgrade (dra-driver, NVIDIA's DRA kubelet plugin, once the GPU pods left).",
    )
    # a version per node pool from one DaemonSet (installer/cluster/pools.py)
    pool_policy: str | None = setting(
        "NVIDIA_INSTALLER_POOL_POLICY", "", setting_parsers.optional_text,
        "Pool policy file (a mounted ConfigMap): ordered rules, node selector (matchLabels) -> "
        "version, kernel module type, source and maxUpgrading, one default; its rule replaces "
        "those settings on the nodes it matches (docs/deploy.md, \"A version per node pool\").",
    )
    node_labels_file: str | None = setting(
        "NVIDIA_INSTALLER_NODE_LABELS_FILE", "", setting_parsers.optional_text,
        "A file of this node's labels (key=value lines, or the kubelet's --node-labels form) "
        "for the pool policy; unset: the Node is read from the API server (NODE_NAME).",
    )
    pool_wait_timeout: float = setting(
        "NVIDIA_INSTALLER_POOL_WAIT_TIMEOUT", "3600", setting_parsers.number,
        "Seconds an upgrade waits for its pool's maxUpgrading budget (other nodes of the pool "
        "mid-upgrade) before failing with the old driver kept.",
    )

    # who may publish the modules a node loads
    module_trusted_keys: Path | None = setting(
        "NVIDIA_MODULE_TRUSTED_KEYS", "", setting_parsers.local_file,
        "PEM file (public keys or certificates) whose cosign signatures make a pulled module "
        "artifact usable. Unset: no pulled artifact is ever used (the node compiles).",
    )
    module_digests: tuple[str, ...] = setting(
        "NVIDIA_MODULE_DIGESTS", "", setting_parsers.digests,
        "Comma-separated sha256:<hex> manifest digests: only these (signed) artifacts are used.",
    )
    module_require_prebuilt: bool = setting(
        "NVIDIA_MODULE_REQUIRE_PREBUILT", "false", setting_parsers.switch,
        "Fail (prebuilt-modules-required) instead of compiling when no verified artifact can "
        "be used.",
        switch=True,
    )
    module_publisher_key: Path | None = setting(
        "NVIDIA_MODULE_PUBLISHER_KEY", "", setting_parsers.local_file,
        "Builder only: PEM private key that signs what `prebuild --push` publishes (cosign's "
        "key-based scheme).",
    )
    module_registry_password_file: Path | None = setting(
        "NVIDIA_MODULE_REGISTRY_PASSWORD_FILE", "", setting_parsers.local_file,
        "File holding the module registry's password or token (a mounted Secret).",
    )
    module_registry_token_realms: tuple[str, ...] = setting(
        "NVIDIA_MODULE_REGISTRY_TOKEN_REALMS", "", setting_parsers.realms,
        "Comma-separated https://host[:port] token services the registry may send the "
        "installer to besides itself (e.g. https://auth.docker.io); others are refused.",
    )
    # the next kernel before the reboot (installer/nextkernel)
    next_kernel: str = setting(
        "NVIDIA_INSTALLER_NEXT_KERNEL", "run", setting_parsers.choice("run", "separate", "off"),
        "Modules for a newer installed kernel (the next boot's) into the cache: run (each run, "
        "after the driver is verified), separate (only `installer prepare-next-kernel`, the "
        "DaemonSet's long-running container) or off.",
    )

    # the daemons beside the driver (installer/components)
    fabricmanager: str = setting(
        "NVIDIA_FABRICMANAGER", "auto", setting_parsers.choice("auto", "false"),
        "auto: where the node manages its own NVLink fabric, install Fabric Manager of the "
        "driver's exact version and run it (`installer fabricmanager`): NVSwitch PCI functions "
        "(HGX/DGX A100, H100, H200), or a ConnectX-7 Limited PF managing NVLink5 switches "
        "(HGX B200/B300), where NVLSM of the driver's redist runs first on the port and the "
        "InfiniBand modules it needs are loaded (never on NVL72 trays, managed off the node); "
        "false: never (the host runs its own Fabric Manager and NVLSM). IMEX: NVIDIA_IMEX.",
    )
    fabricmanager_redist: tuple[str, ...] = setting(
        "NVIDIA_FABRICMANAGER_REDIST",
        "https://developer.download.nvidia.com/compute/nvidia-driver/redist",
        setting_parsers.redist,
        "Comma-separated base URLs of NVIDIA's driver redist tree, tried in order (mirrors "
        "first): each holds the driver version's redistrib_<version>.json and the archives "
        "it names: Fabric Manager, IMEX (nvidia-imex, nvidia-imex-ctl) and NVLSM (unless "
        "NVIDIA_NVLSM_VERSION pins one from NVIDIA_NVLSM_REDIST).",
    )
    imex: str = setting(
        "NVIDIA_IMEX", "auto", setting_parsers.choice("auto", "install", "false"),
        "auto: on GB200/GB300 trays install nvidia-imex and nvidia-imex-ctl of the driver's "
        "exact version into the install dir (the DRA driver runs them); install: on any node; "
        "false: never.",
    )
    imex_nodes: str | None = setting(
        "NVIDIA_IMEX_NODES", "", setting_parsers.optional_text,
        "`installer imex`: the IMEX domain's nodes, the same on each: comma-separated IP "
        "addresses, or the absolute path of a file (a mounted ConfigMap key) with one a line. "
        "Required where the imex container runs IMEX; never guessed.",
    )
    imex_socket: PurePosixPath | None = setting(
        "NVIDIA_IMEX_SOCKET", "/etc/nvidia-imex/imex_ctrl.sock", setting_parsers.host_abs_path,
        "`installer imex`: IMEX's command socket (IMEX_CMD_UNIX_DOMAIN_PATH) inside the driver "
        "root (the install dir): the DRA driver's imex.hostSocketPath, whose default this is.",
    )
    imex_channels: str = setting(
        "NVIDIA_IMEX_CHANNELS", "dra", setting_parsers.choice("dra", "channel0"),
        "`installer imex`: dra: the DRA driver hands out IMEX channels (nothing created); "
        "channel0: create /dev/nvidia-caps-imex-channels/channel0 (nvidia-modprobe -i 0:1) "
        "where no DRA driver does.",
    )
    nvlsm_version: str | None = setting(
        "NVIDIA_NVLSM_VERSION", "", setting_parsers.date_version,
        "NVLSM (NVLink5 nodes: HGX B200/B300) of this version (YYYY.MM.N) from "
        "NVIDIA_NVLSM_REDIST; unset: the one the driver's redistrib_<version>.json lists.",
    )
    nvlsm_redist: tuple[str, ...] = setting(
        "NVIDIA_NVLSM_REDIST",
        "https://developer.download.nvidia.com/compute/cuda/redist", setting_parsers.redist,
        "Comma-separated base URLs of NVIDIA's CUDA redist tree (mirrors first) holding "
        "nvlsm/linux-<arch>/nvlsm-linux-<arch>-<version>-archive.tar.xz, for "
        "NVIDIA_NVLSM_VERSION.",
    )
    nvlsm_sha256: str | None = setting(
        "NVIDIA_NVLSM_SHA256", "", setting_parsers.sha256,
        "Expected SHA-256 of the NVIDIA_NVLSM_VERSION archive (else its "
        "NVIDIA_DRIVER_DIGESTS_FILE entry).",
    )
    persistenced: bool = setting(
        "NVIDIA_INSTALLER_PERSISTENCED", "true", setting_parsers.switch,
        "true: run the installed nvidia-persistenced with persistence mode on (`installer "
        "persistenced`); false: the host manages persistence (its own nvidia-persistenced): the "
        "container idles as not-applicable and the scheduling gate does not wait for it.",
    )
    fabric_timeout: float = setting(
        "NVIDIA_INSTALLER_FABRIC_TIMEOUT", "600", setting_parsers.seconds_or_never,
        "`installer fabricmanager`: seconds to wait for every GPU that reports an NVLink fabric "
        "to complete it before saying what is missing (fabric-not-ready: the container exits "
        "where nothing of ours manages the fabric, else it logs and waits on); 0: never.",
    )
    gpudirect_rdma: bool = setting(
        "NVIDIA_GPUDIRECT_RDMA", "false", setting_parsers.switch,
        "true: load nvidia-peermem after the driver where a Mellanox PCI device (15b3) is "
        "present, once MOFED/DOCA-OFED's ib_core is loaded (GPUDirect RDMA).",
    )
    ofed_timeout: float = setting(
        "NVIDIA_GPUDIRECT_OFED_TIMEOUT", "300", setting_parsers.number,
        "Seconds to wait for MOFED/DOCA-OFED's ib_core before nvidia-peermem is given up on "
        "(ofed-not-ready).",
    )
    daemon_restarts: int = setting(
        "NVIDIA_INSTALLER_DAEMON_RESTARTS", "5", setting_parsers.count,
        "How often `installer fabricmanager` / `persistenced` / `imex` restart a daemon that "
        "died (backoff 1 s doubling to 30 s) within 10 minutes before exiting non-zero.",
    )

    # the scheduling gate (installer/cluster/scheduling_gate.py, docs/deploy.md)
    scheduling_gate: bool = setting(
        "NVIDIA_INSTALLER_SCHEDULING_GATE", "false", setting_parsers.switch,
        "Keep the node tainted (NVIDIA_INSTALLER_GATE_TAINT, NoSchedule) until the driver is "
        "verified and what it needs is up; taint it again before a driver is unloaded; label it "
        "with the verified version (needs NODE_NAME and the API; see docs/deploy.md).",
        switch=True,
    )
    gate_taint: str = setting(
        "NVIDIA_INSTALLER_GATE_TAINT", "nvidia.com/gpu.driver-not-ready", setting_parsers.taint_key,
        "Key of the scheduling gate's NoSchedule taint (register nodes with it).",
    )
    gate_close_after: float = setting(
        "NVIDIA_INSTALLER_GATE_CLOSE_AFTER", "60", setting_parsers.seconds_or_never,
        "`installer gate`: seconds the driver or a component it needs may stay down on an open "
        "node before the taint goes back on (0: never).",
    )

    # what the node tells the cluster (installer/cluster/condition.py, events.py)
    cluster_signals: bool = setting(
        "NVIDIA_INSTALLER_CLUSTER_SIGNALS", "false", setting_parsers.switch,
        "Set the node's NvidiaDriverReady condition after every run (kept up to date by "
        "`installer gate`), post an Event on the node for each install outcome, and publish "
        "the verified driver version as node labels (nvidia.com/gpu.present, "
        "nvidia.com/cuda.driver-version.*) and annotations (needs NODE_NAME and the API; see "
        "docs/cluster-signals.md).",
        switch=True,
    )
    gke_driver_annotations: bool = setting(
        "NVIDIA_INSTALLER_GKE_DRIVER_ANNOTATIONS", "false", setting_parsers.switch,
        "With the cluster signals on, also publish the verified driver version as GKE's "
        "cloud.google.com/cuda.driver-version.{full,major,minor,revision} annotations on the "
        "node (beside the installer's own; see docs/cluster-signals.md).",
        switch=True,
    )
    gpu_feature_discovery: bool = setting(
        "NVIDIA_INSTALLER_GPU_FEATURE_DISCOVERY", "false", setting_parsers.switch,
        "GPU Feature Discovery runs on the nodes: with the cluster signals on, leave the "
        "nvidia.com/cuda.driver-version.* labels to it (the installer still sets "
        "nvidia.com/gpu.present=true).",
        switch=True,
    )

    def module_args_for(self, module: str) -> list[str]:
        """`param=value` strings for one module (names compare with - and _ alike)."""
        wanted = module.replace("-", "_")
        return [arg for mod, arg in self.module_args if mod.replace("-", "_") == wanted]


def settings_of(table: type) -> tuple[Setting, ...]:
    """The Setting of every field of `table`, in field order; KeyError for a field that was not
    declared with `setting(...)`."""
    return tuple(f.metadata["setting"]._replace(name=f.name) for f in fields(table))


SETTINGS = settings_of(Config)


def secret_env_vars() -> frozenset[str]:
    """The environment variables holding credentials: never passed to children."""
    return frozenset(s.env for s in SETTINGS if s.secret)


def known_env_vars() -> frozenset[str]:
    """Every environment variable the installer reads."""
    return frozenset(s.env for s in SETTINGS)


def build_config(env: Mapping[str, str], overrides: Mapping[str, str | bool | None]) -> Config:
    """Merge defaults < environment < explicit flags into a validated Config.

    Raises ConfigError naming the offending variable.
    """
    values: dict[str, object] = {}
    for setting in SETTINGS:
        override = overrides.get(setting.name)
        if isinstance(override, bool):
            override = "true" if override else "false"
        raw = override if override is not None else env.get(setting.env, setting.default)
        values[setting.name] = setting.parse(raw, setting)
    config = Config(**values)  # type: ignore[arg-type]
    check_consistency(config)
    return config


def from_env(env: Mapping[str, str]) -> Config:
    """A Config from environment variables alone (what a DaemonSet sets)."""
    return build_config(env, {})


def check_consistency(config: Config) -> None:
    """Settings that must agree with each other (ConfigError naming them)."""
    if (config.signing_key is None) != (config.signing_cert is None):
        raise ConfigError(
            "NVIDIA_MODULE_SIGNING_KEY and NVIDIA_MODULE_SIGNING_CERT must be set together",
        )
    if not config.root.is_absolute():
        raise ConfigError(f"ROOT_MOUNT_DIR={config.root} must be an absolute path")
    check_registry(config)
    if config.scheduling_gate and not config.node_name:  # the gate labels this node
        raise ConfigError(
            "NVIDIA_INSTALLER_SCHEDULING_GATE=true needs NODE_NAME (this node's name)",
            hint="In the DaemonSet set NODE_NAME from the downward API (fieldRef spec.nodeName).",
        )
    if config.cluster_signals and not config.node_name:  # the condition is this node's
        raise ConfigError(
            "NVIDIA_INSTALLER_CLUSTER_SIGNALS=true needs NODE_NAME (this node's name)",
            hint="In the DaemonSet set NODE_NAME from the downward API (fieldRef spec.nodeName).",
        )
    if config.upgrade_protocol and not config.node_name:  # the protocol cordons this node
        raise ConfigError(
            "NVIDIA_INSTALLER_UPGRADE_PROTOCOL=true needs NODE_NAME (this node's name)",
            hint="In the DaemonSet set NODE_NAME from the downward API (fieldRef spec.nodeName).",
        )


def check_registry(config: Config) -> None:
    """Asking to publish without a registry or a publisher key is an error, not a silent
    no-op; one password source only (two would leave which one wins to chance)."""
    if config.module_registry_push and not config.module_registry:
        raise ConfigError(
            "NVIDIA_MODULE_REGISTRY_PUSH=true (or --push) needs NVIDIA_MODULE_REGISTRY: there "
            "is nowhere to publish",
            hint="Set NVIDIA_MODULE_REGISTRY=<host[:port]/repository>, or drop the push.",
        )
    if config.module_registry_push and config.module_publisher_key is None:
        raise ConfigError(
            "NVIDIA_MODULE_REGISTRY_PUSH=true (or --push) needs NVIDIA_MODULE_PUBLISHER_KEY: "
            "nodes use only artifacts signed by a key they trust",
            hint="Give the builder the private key (a mounted Secret) whose public key the "
            "nodes have in NVIDIA_MODULE_TRUSTED_KEYS (docs/deploy.md).",
        )
    if config.module_require_prebuilt and not (config.module_registry
                                               and config.module_trusted_keys):
        raise ConfigError(
            "NVIDIA_MODULE_REQUIRE_PREBUILT=true needs NVIDIA_MODULE_REGISTRY and "
            "NVIDIA_MODULE_TRUSTED_KEYS: without both no artifact can ever be used",
        )
    if config.module_registry_password and config.module_registry_password_file:
        raise ConfigError(
            "NVIDIA_MODULE_REGISTRY_PASSWORD and NVIDIA_MODULE_REGISTRY_PASSWORD_FILE are both "
            "set: use one",
        )
