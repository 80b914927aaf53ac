"""The frozen run configuration and the environment-variable contract (GKE's names first)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

from installer.errors import ConfigError


@dataclass(frozen=True)
class Setting:
    """One setting: its Config field, environment variable, CLI flag, default and meaning."""

    name: str
    env: str
    default: str
    help: str
    flag_is_switch: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


SETTINGS: tuple[Setting, ...] = (
    Setting("root", "ROOT_MOUNT_DIR", "/", "Where the host's / is mounted (GKE: /root)."),
    Setting(
        "version",
        "NVIDIA_DRIVER_VERSION",
        "auto",
        "Exact version (550.54.15), branch (550, R550) or alias (auto, latest, production, lts).",
    ),
    Setting(
        "branch_path",
        "NVIDIA_DRIVER_BRANCH",
        "tesla",
        "Path element of the default download URL (GKE's meaning).",
    ),
    Setting(
        "download_url",
        "NVIDIA_DRIVER_DOWNLOAD_URL",
        "",
        "Full URL of the .run (http, https or file://); overrides the default URL.",
    ),
    Setting(
        "sha256",
        "NVIDIA_DRIVER_SHA256",
        "",
        "Expected SHA-256 of the .run; otherwise the published .sha256sum is used when present.",
    ),
    Setting(
        "mirrors",
        "NVIDIA_DRIVER_MIRRORS",
        "",
        "Comma-separated base URLs tried before the default; each holds <version>/<runfile>.",
    ),
    Setting(
        "install_dir_host",
        "NVIDIA_INSTALL_DIR_HOST",
        "/var/lib/nvidia",
        "Install dir as the host sees it (GKE DaemonSets: /home/kubernetes/bin/nvidia).",
    ),
    Setting(
        "install_dir_container",
        "NVIDIA_INSTALL_DIR_CONTAINER",
        "/usr/local/nvidia",
        "The same dir as mounted in the installer container.",
    ),
    Setting("source", "NVIDIA_DRIVER_SOURCE", "auto", "auto, runfile or dnf."),
    Setting(
        "module_type",
        "NVIDIA_KERNEL_MODULE_TYPE",
        "auto",
        "Kernel module flavour: auto, open or proprietary.",
    ),
    Setting(
        "track",
        "NVIDIA_DRIVER_TRACK",
        "lts",
        "Branch type `auto` picks from: lts or production.",
    ),
    Setting(
        "kernel_release",
        "NVIDIA_KERNEL_RELEASE",
        "",
        "Build for this kernel instead of the running one (building ahead; nothing is loaded).",
    ),
    Setting(
        "module_args",
        "NVIDIA_MODULE_ARGS",
        "",
        "Extra module parameters, space-separated module.param=value "
        "(e.g. nvidia.NVreg_EnableGpuFirmware=0).",
    ),
    Setting(
        "signing_key",
        "NVIDIA_MODULE_SIGNING_KEY",
        "",
        "Private key (host path) to sign modules for Secure Boot; needs the certificate too.",
    ),
    Setting(
        "signing_cert",
        "NVIDIA_MODULE_SIGNING_CERT",
        "",
        "Public certificate (host path, DER or PEM) matching the signing key.",
    ),
    Setting(
        "cache_dir",
        "NVIDIA_INSTALLER_CACHE_DIR",
        "",
        "Host path for downloads and compiled modules (default: <install dir>/cache).",
    ),
    Setting(
        "catalog",
        "NVIDIA_DRIVER_CATALOG",
        "",
        "Version catalog in NVIDIA's releases.json shape: a path or URL (default: shipped).",
    ),
    Setting(
        "dnf_repo_url",
        "NVIDIA_DNF_REPO_URL",
        "",
        "dnf repo file URL for the RHEL family (default: NVIDIA's cuda-rhel<N>.repo).",
    ),
    Setting(
        "fetch_headers",
        "NVIDIA_INSTALLER_FETCH_HEADERS",
        "auto",
        "Fetch missing kernel headers from the host's package sources (or the headers mirror) "
        "into the cache: auto or true (yes), false (no).",
    ),
    Setting("retries", "NVIDIA_INSTALLER_RETRIES", "5", "Download attempts per mirror."),
    Setting(
        "connect_timeout",
        "NVIDIA_INSTALLER_CONNECT_TIMEOUT",
        "10",
        "Seconds to wait for a download connection.",
    ),
    Setting(
        "read_timeout",
        "NVIDIA_INSTALLER_READ_TIMEOUT",
        "60",
        "Seconds a download may stall before it is retried.",
    ),
    Setting(
        "lock_timeout",
        "NVIDIA_INSTALLER_LOCK_TIMEOUT",
        "600",
        "Seconds to wait for another installer's host lock before failing.",
    ),
    Setting(
        "allow_no_gpu",
        "NVIDIA_INSTALLER_ALLOW_NO_GPU",
        "false",
        "Install even when no NVIDIA GPU is found (modules are built, not loaded).",
        flag_is_switch=True,
    ),
    Setting("log_format", "NVIDIA_INSTALLER_LOG_FORMAT", "text", "text or json."),
    Setting(
        "termination_log",
        "NVIDIA_INSTALLER_TERMINATION_LOG",
        "/dev/termination-log",
        "Where a failure's reference and hint are written for `kubectl describe pod` "
        "(only if the file exists, as Kubernetes creates it).",
    ),
    # issue 14
    Setting(
        "allow_unverified",
        "NVIDIA_DRIVER_ALLOW_UNVERIFIED",
        "false",
        "Accept a downloaded .run that no SHA-256 (pin or published .sha256sum) vouches for.",
        flag_is_switch=True,
    ),
    Setting(
        "module_registry",
        "NVIDIA_MODULE_REGISTRY",
        "",
        "OCI repository (host[:port]/path) holding prebuilt kernel modules; `run` pulls a "
        "matching artifact instead of compiling. Unset: always compile.",
    ),
    Setting(
        "module_registry_plain_http",
        "NVIDIA_MODULE_REGISTRY_PLAIN_HTTP",
        "false",
        "Talk to the module registry over plain HTTP (a registry without TLS).",
        flag_is_switch=True,
    ),
    Setting(
        "module_registry_push",
        "NVIDIA_MODULE_REGISTRY_PUSH",
        "false",
        "Publish modules this node compiled to the module registry (needs push credentials).",
        flag_is_switch=True,
    ),
    Setting(
        "module_registry_username",
        "NVIDIA_MODULE_REGISTRY_USERNAME",
        "",
        "User name for the module registry (from a Kubernetes Secret).",
    ),
    Setting(
        "module_registry_password",
        "NVIDIA_MODULE_REGISTRY_PASSWORD",
        "",
        "Password or token for the module registry (from a Kubernetes Secret; never logged).",
    ),
    # issue 12
    Setting(
        "headers_mirror",
        "NVIDIA_INSTALLER_HEADERS_MIRROR",
        "",
        "Mirror of the host's package archive for kernel headers (air-gapped nodes): replaces "
        "the URI of every apt source (suites, components, keys kept), or each dnf repo's "
        "baseurl with <mirror>/<repo id>/ (reposync's layout).",
    ),
    Setting(
        "rocky_vault",
        "NVIDIA_INSTALLER_ROCKY_VAULT",
        "https://dl.rockylinux.org/vault/rocky",
        "Rocky Linux's vault: kernel-devel of older minor releases (<vault>/<minor>/BaseOS and "
        "AppStream).",
    ),
    # issue 10
    Setting(
        "dnf_enable_epel",
        "NVIDIA_DNF_ENABLE_EPEL",
        "false",
        "dnf source, DKMS streams: install epel-release (from the host's repos) when no EPEL "
        "repo is enabled, for `dkms`. Off: adding a third-party repo is the operator's call.",
        flag_is_switch=True,
    ),
    # issue 13: the node-side upgrade protocol (installer/cluster)
    Setting(
        "upgrade_protocol",
        "NVIDIA_INSTALLER_UPGRADE_PROTOCOL",
        "false",
        "When a different, held driver is loaded: cordon, pause GPU clients, evict GPU pods, "
        "upgrade, restore (needs NODE_NAME and the API; see docs/deploy.md).",
        flag_is_switch=True,
    ),
    Setting("node_name", "NODE_NAME", "", "This node's name (the DaemonSet sets it from the "
            "downward API spec.nodeName)."),
    Setting(
        "kubeconfig",
        "NVIDIA_INSTALLER_KUBECONFIG",
        "",
        "kubeconfig file for the API server (default: the pod's service account).",
    ),
    Setting(
        "eviction_timeout",
        "NVIDIA_INSTALLER_EVICTION_TIMEOUT",
        "600",
        "Seconds GPU pods may take to leave (PodDisruptionBudgets honoured) before failing.",
    ),
    Setting(
        "holders_timeout",
        "NVIDIA_INSTALLER_HOLDERS_TIMEOUT",
        "300",
        "Seconds to wait, after the pods left, for every process to close /dev/nvidia*.",
    ),
    Setting(
        "force_eviction",
        "NVIDIA_INSTALLER_FORCE_EVICTION",
        "false",
        "Delete GPU pods still there at the eviction timeout, bypassing their "
        "PodDisruptionBudgets.",
        flag_is_switch=True,
    ),
    Setting(
        "pause_components",
        "NVIDIA_INSTALLER_PAUSE_COMPONENTS",
        "device-plugin,gpu-feature-discovery,dcgm-exporter,dcgm,mig-manager",
        "Components <c> whose nvidia.com/gpu.deploy.<c> label is set to "
        "paused-for-driver-upgrade during an upgrade.",
    ),
    # issue 21: the next kernel before the reboot (installer/nextkernel.py)
    Setting(
        "next_kernel",
        "NVIDIA_INSTALLER_NEXT_KERNEL",
        "run",
        "Modules for a newer installed kernel (the next boot's) into the cache: run (each run, "
        "after the driver is verified), separate (only `installer prepare-next-kernel`, the "
        "DaemonSet's long-running container) or off.",
    ),
)

SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_MODULE_ARG = re.compile(r"^[a-z0-9_-]+\.[A-Za-z0-9_]+=[A-Za-z0-9_.,:/+-]*$")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


def known_env_vars() -> frozenset[str]:
    """Every environment variable the installer reads."""
    return frozenset(s.env for s in SETTINGS)


@dataclass(frozen=True)
class Config:
    root: Path = Path("/")
    version: str = "auto"
    branch_path: str = "tesla"
    download_url: str | None = None
    sha256: str | None = None
    mirrors: tuple[str, ...] = ()
    install_dir_host: PurePosixPath = PurePosixPath("/var/lib/nvidia")
    install_dir_container: Path = Path("/usr/local/nvidia")
    source: str = "auto"
    module_type: str = "auto"
    track: str = "lts"
    kernel_release: str | None = None
    module_args: tuple[tuple[str, str], ...] = ()
    signing_key: PurePosixPath | None = None
    signing_cert: PurePosixPath | None = None
    cache_dir: PurePosixPath | None = None
    catalog: str | None = None
    dnf_repo_url: str | None = None
    fetch_headers: str = "auto"
    retries: int = 5
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    lock_timeout: float = 600.0
    allow_no_gpu: bool = False
    log_format: str = "text"
    termination_log: str = "/dev/termination-log"
    allow_unverified: bool = False  # issue 14
    module_registry: str | None = None
    module_registry_plain_http: bool = False
    module_registry_push: bool = False
    module_registry_username: str | None = None
    module_registry_password: str | None = field(default=None, repr=False)
    headers_mirror: str | None = None
    rocky_vault: str = "https://dl.rockylinux.org/vault/rocky"
    dnf_enable_epel: bool = False  # issue 10
    # issue 13
    upgrade_protocol: bool = False
    node_name: str | None = None
    kubeconfig: str | None = None
    eviction_timeout: float = 600.0
    holders_timeout: float = 300.0
    force_eviction: bool = False
    pause_components: tuple[str, ...] = (
        "device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "mig-manager")
    next_kernel: str = "run"  # issue 21
    extra: Mapping[str, str] = field(default_factory=dict)

    def module_args_for(self, module: str) -> list[str]:
        """`param=value` strings for one module (names compare with - and _ alike)."""
        wanted = module.replace("-", "_")
        return [arg for mod, arg in self.module_args if mod.replace("-", "_") == wanted]


def _choice(*allowed: str) -> Callable[[str, Setting], str]:
    def parse(value: str, setting: Setting) -> str:
        if value not in allowed:
            raise ConfigError(
                f"{setting.env}={value!r} is not one of {', '.join(allowed)}",
            )
        return value

    return parse


def _number(value: str, setting: Setting) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number <= 0:
        raise ConfigError(f"{setting.env}={value!r} must be a positive number")
    return number


def _count(value: str, setting: Setting) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{setting.env}={value!r} must be a whole number >= 1")
    return int(value)


def _switch(value: str, setting: Setting) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{setting.env}={value!r} must be true or false")


def _host_abs_path(value: str, setting: Setting) -> PurePosixPath | None:
    if not value:
        return None
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts:
        raise ConfigError(f"{setting.env}={value!r} must be an absolute path without '..'")
    return path


def _required_host_path(value: str, setting: Setting) -> PurePosixPath:
    path = _host_abs_path(value, setting)
    if path is None or path == PurePosixPath("/"):
        raise ConfigError(f"{setting.env} must be an absolute directory other than /")
    return check_build_path(setting.env, path)


# Paths that reach make (M=, --tmpdir) and shells: make expands `$(...)` and splits on spaces,
# so only characters with no meaning to make or sh are allowed.
_BUILD_PATH = re.compile(r"^/[A-Za-z0-9._+@/-]*$", re.ASCII)


def check_build_path(what: str, path: PurePosixPath | Path) -> PurePosixPath:
    """`path` unchanged if it is safe to pass to make and sh; else ConfigError naming `what`."""
    if not _BUILD_PATH.fullmatch(str(path)):
        raise ConfigError(
            f"{what}={str(path)!r} holds characters that make or the shell would interpret "
            "(spaces, $, quotes, ...)",
            hint="Use a path of letters, digits and '/', '.', '_', '+', '@', '-' only.",
        )
    return PurePosixPath(path)


def _build_path(value: str, setting: Setting) -> PurePosixPath | None:
    path = _host_abs_path(value, setting)
    return None if path is None else check_build_path(setting.env, path)


def _root(value: str, setting: Setting) -> Path:
    return Path(str(check_build_path(setting.env, PurePosixPath(value or "/"))))


def _url(value: str, setting: Setting) -> str | None:
    if not value:
        return None
    from installer.delivery.urls import control_character

    bad = control_character(value)
    if bad is not None:
        raise ConfigError(
            f"{setting.env}={_redact(value)!r} holds a control character ({bad}): "
            "a pasted newline or tab is not part of a URL",
            hint=f"Set {setting.env} to the URL alone, without trailing whitespace.",
        )
    if not re.match(r"^(https?|file)://\S+\Z", value):
        raise ConfigError(f"{setting.env}={_redact(value)!r} must be an http(s):// or file:// URL")
    return value


def _mirrors(value: str, setting: Setting) -> tuple[str, ...]:
    items = [v.strip() for v in re.split(r"[,\s]+", value) if v.strip()]
    return tuple(_url(item, setting) or "" for item in items)


def _module_args(value: str, setting: Setting) -> tuple[tuple[str, str], ...]:
    parsed = []
    for item in value.split():
        if not _MODULE_ARG.match(item):
            raise ConfigError(
                f"{setting.env}: {item!r} is not module.param=value",
                hint="Example: NVIDIA_MODULE_ARGS='nvidia.NVreg_EnableGpuFirmware=0'",
            )
        module, arg = item.split(".", 1)
        parsed.append((module, arg))
    return tuple(parsed)


def _sha256(value: str, setting: Setting) -> str | None:
    if not value:
        return None
    if not _SHA256.match(value):
        raise ConfigError(f"{setting.env} must be 64 hexadecimal characters")
    return value.lower()


def _kernel_release(value: str, setting: Setting) -> str | None:
    if not value:
        return None
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._+~-]*$", value):
        raise ConfigError(f"{setting.env}={value!r} is not a kernel release")
    return value


def _version(value: str, setting: Setting) -> str:
    # Full validation (exact, branch or alias) happens in versions.parse_request.
    return value.strip() or "auto"


def _text(value: str, setting: Setting) -> str:
    return value


def _optional_text(value: str, setting: Setting) -> str | None:
    return value or None


def _redact(url: str) -> str:
    from installer.delivery.urls import redact_url

    return redact_url(url)


_PARSERS: dict[str, Callable[[str, Setting], object]] = {
    "root": _root,
    "version": _version,
    "branch_path": lambda v, s: _branch_path(v, s),
    "download_url": _url,
    "sha256": _sha256,
    "mirrors": _mirrors,
    "install_dir_host": _required_host_path,
    "install_dir_container": lambda v, s: Path(str(_required_host_path(v, s))),
    "source": _choice("auto", "runfile", "dnf"),
    "module_type": _choice("auto", "open", "proprietary"),
    "track": _choice("lts", "production"),
    "kernel_release": _kernel_release,
    "module_args": _module_args,
    "signing_key": _host_abs_path,
    "signing_cert": _host_abs_path,
    "cache_dir": _build_path,
    "catalog": _optional_text,
    "dnf_repo_url": _url,
    "fetch_headers": _choice("auto", "true", "false"),
    "retries": _count,
    "connect_timeout": _number,
    "read_timeout": _number,
    "lock_timeout": _number,
    "allow_no_gpu": _switch,
    "log_format": _choice("text", "json"),
    "termination_log": _text,
    "allow_unverified": _switch,  # issue 14
    "module_registry": lambda v, s: _registry(v, s),
    "module_registry_plain_http": _switch,
    "module_registry_push": _switch,
    "module_registry_username": _optional_text,
    "module_registry_password": _optional_text,
    "headers_mirror": _url,
    "rocky_vault": lambda v, s: _url(v, s) or "",
    "dnf_enable_epel": _switch,
    # issue 13
    "upgrade_protocol": _switch,
    "node_name": lambda v, s: _node_name(v, s),
    "kubeconfig": _optional_text,
    "eviction_timeout": _number,
    "holders_timeout": _number,
    "force_eviction": _switch,
    "pause_components": lambda v, s: _components(v, s),
    "next_kernel": _choice("run", "separate", "off"),  # issue 21
}


def _registry(value: str, setting: Setting) -> str | None:
    """`host[:port]/path` as OCI references spell a repository (lower-case path)."""
    value = value.strip()
    if not value:
        return None
    if not re.match(
        r"^[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+\Z", value
    ):
        raise ConfigError(
            f"{setting.env}={value!r} is not an OCI repository",
            hint=f"Example: {setting.env}=registry.example.com/gpu/nvidia-modules "
            "(no scheme, no tag).",
        )
    return value


def _node_name(value: str, setting: Setting) -> str | None:
    value = value.strip()
    if value and not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", value):
        raise ConfigError(f"{setting.env}={value!r} is not a Kubernetes node name")
    return value or None


def _components(value: str, setting: Setting) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    for item in items:
        # The label key nvidia.com/gpu.deploy.<c> has a name part of at most 63 characters.
        if not re.match(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$", item):
            raise ConfigError(f"{setting.env}: {item!r} is not a component name "
                              "(lower-case letters, digits and '-')")
    return items


def _branch_path(value: str, setting: Setting) -> str:
    if not re.match(r"^[A-Za-z0-9._-]+$", value):
        raise ConfigError(f"{setting.env}={value!r} may hold letters, digits, '.', '_', '-' only")
    return value


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
        values[setting.name] = _PARSERS[setting.name](raw, setting)
    config = Config(**values)  # type: ignore[arg-type]
    _check_consistency(config)
    return config


def from_env(env: Mapping[str, str]) -> Config:
    """A Config from environment variables alone (what a DaemonSet sets)."""
    return build_config(env, {})


def _check_consistency(config: Config) -> None:
    if (config.signing_key is None) != (config.signing_cert is None):
        raise ConfigError(
            "NVIDIA_MODULE_SIGNING_KEY and NVIDIA_MODULE_SIGNING_CERT must be set together",
        )
    if not config.root.is_absolute():
        raise ConfigError(f"ROOT_MOUNT_DIR={config.root} must be an absolute path")
    if config.upgrade_protocol and not config.node_name:  # issue 13
        raise ConfigError(
            "NVIDIA_INSTALLER_UPGRADE_PROTOCOL=true needs NODE_NAME (this node's name)",
            hint="In the DaemonSet set NODE_NAME from the downward API (fieldRef spec.nodeName).",
        )
