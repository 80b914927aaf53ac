"""Parsers of setting values: the text of a flag or environment variable to a typed value, or a
ConfigError naming the variable (`config.py` names which parser each setting uses, and the
rules between settings)."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Callable, Protocol

from installer.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_MODULE_ARG = r"^[a-z0-9_-]+\.[A-Za-z0-9_]+=[A-Za-z0-9_.,:/+-]*$"
_SHA256 = r"^[0-9a-fA-F]{64}$"


class Named(Protocol):
    """What a parser needs of its setting: the variable to name in errors."""

    @property
    def env(self) -> str: ...


def choice(*allowed: str) -> Callable[[str, Named], str]:
    def parse(value: str, setting: Named) -> str:
        if value not in allowed:
            raise ConfigError(
                f"{setting.env}={value!r} is not one of {', '.join(allowed)}",
            )
        return value

    return parse


def _float(value: str) -> float:
    """What `value` says as a number, or -1 for no number (no setting takes a negative one)."""
    try:
        return float(value)
    except ValueError:
        return -1.0


def number(value: str, setting: Named) -> float:
    number = _float(value)
    if number <= 0:
        raise ConfigError(f"{setting.env}={value!r} must be a positive number")
    return number


def count(value: str, setting: Named) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{setting.env}={value!r} must be a whole number >= 1")
    return int(value)


def switch(value: str, setting: Named) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{setting.env}={value!r} must be true or false")


def host_abs_path(value: str, setting: Named) -> PurePosixPath | None:
    if not value:
        return None
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts:
        raise ConfigError(f"{setting.env}={value!r} must be an absolute path without '..'")
    return path


def required_host_path(value: str, setting: Named) -> PurePosixPath:
    path = host_abs_path(value, setting)
    if path is None or path == PurePosixPath("/"):
        raise ConfigError(f"{setting.env} must be an absolute directory other than /")
    return check_build_path(setting.env, path)


# Paths that reach make (M=, --tmpdir) and shells: make expands `$(...)` and splits on spaces,
# so only characters with no meaning to make or sh are allowed.
_BUILD_PATH = r"(?a)^/[A-Za-z0-9._+@/-]*$"


def check_build_path(what: str, path: PurePosixPath | Path) -> PurePosixPath:
    """`path` unchanged if it is safe to pass to make and sh; else ConfigError naming `what`."""
    if not re.fullmatch(_BUILD_PATH, str(path)):
        raise ConfigError(
            f"{what}={str(path)!r} holds characters that make or the shell would interpret "
            "(spaces, $, quotes, ...)",
            hint="Use a path of letters, digits and '/', '.', '_', '+', '@', '-' only.",
        )
    return PurePosixPath(path)


def build_path(value: str, setting: Named) -> PurePosixPath | None:
    path = host_abs_path(value, setting)
    return None if path is None else check_build_path(setting.env, path)


def root(value: str, setting: Named) -> Path:
    return Path(str(check_build_path(setting.env, PurePosixPath(value or "/"))))


def url(value: str, setting: Named) -> str | None:
    if not value:
        return None
    # Control characters are not printable: a printable URL needs no closer look (and the
    # defaults, parsed when config is imported, load nothing of delivery).
    if not value.isprintable():
        from installer.delivery import control_character

        bad = control_character(value)
    else:
        bad = None
    if bad is not None:
        raise ConfigError(
            f"{setting.env}={_redact(value)!r} holds a control character ({bad}): "
            "a pasted newline or tab is not part of a URL",
            hint=f"Set {setting.env} to the URL alone, without trailing whitespace.",
        )
    if not re.match(r"^(https?|file)://\S+\Z", value):
        raise ConfigError(f"{setting.env}={_redact(value)!r} must be an http(s):// or file:// URL")
    return value


def mirrors(value: str, setting: Named) -> tuple[str, ...]:
    items = [v.strip() for v in re.split(r"[,\s]+", value) if v.strip()]
    return tuple(url(item, setting) or "" for item in items)


def redist(value: str, setting: Named) -> tuple[str, ...]:
    """Base URLs of a redist tree (mirrors first), at least one."""
    bases = tuple(base.rstrip("/") for base in mirrors(value, setting) if base)
    if not bases:
        raise ConfigError(f"{setting.env} must name at least one URL")
    return bases


def module_args(value: str, setting: Named) -> tuple[tuple[str, str], ...]:
    parsed = []
    for item in value.split():
        if not re.match(_MODULE_ARG, item):
            raise ConfigError(
                f"{setting.env}: {item!r} is not module.param=value",
                hint="Example: NVIDIA_MODULE_ARGS='nvidia.NVreg_EnableGpuFirmware=0'",
            )
        module, arg = item.split(".", 1)
        parsed.append((module, arg))
    return tuple(parsed)


def sha256(value: str, setting: Named) -> str | None:
    if not value:
        return None
    if not re.match(_SHA256, value):
        raise ConfigError(f"{setting.env} must be 64 hexadecimal characters")
    return value.lower()


def kernel_release(value: str, setting: Named) -> str | None:
    if not value:
        return None
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._+~-]*$", value):
        raise ConfigError(f"{setting.env}={value!r} is not a kernel release")
    return value


def version(value: str, setting: Named) -> str:
    # Full validation (exact, branch or alias) happens in versions.parse_request.
    return value.strip() or "auto"


def date_version(value: str, setting: Named) -> str | None:
    """A date-versioned component (NVLSM: 2025.10.12), or None when empty."""
    if not value.strip():
        return None
    if not re.match(r"^\d{4}\.\d{2}\.\d+$", value.strip()):
        raise ConfigError(f"{setting.env}={value!r} is not a version of the form YYYY.MM.N",
                          hint="Example: 2025.10.12 (the nvlsm archive's or package's version).")
    return value.strip()


def text(value: str, setting: Named) -> str:
    return value


def optional_text(value: str, setting: Named) -> str | None:
    return value or None


def _redact(url: str) -> str:
    from installer.delivery import redact_url

    return redact_url(url)


def registry(value: str, setting: Named) -> str | None:
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


def node_name(value: str, setting: Named) -> str | None:
    value = value.strip()
    if value and not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", value):
        raise ConfigError(f"{setting.env}={value!r} is not a Kubernetes node name")
    return value or None


def components(value: str, setting: Named) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    for item in items:
        # The label key nvidia.com/gpu.deploy.<c> has a name part of at most 63 characters.
        if not re.match(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$", item):
            raise ConfigError(f"{setting.env}: {item!r} is not a component name "
                              "(lower-case letters, digits and '-')")
    return items


def branch_path(value: str, setting: Named) -> str:
    if not re.match(r"^[A-Za-z0-9._-]+$", value):
        raise ConfigError(f"{setting.env}={value!r} may hold letters, digits, '.', '_', '-' only")
    return value


def container_path(value: str, setting: Named) -> Path:
    """A directory as this process (the container) sees it: absolute, not /, safe for make."""
    return Path(str(required_host_path(value, setting)))


def url_or_empty(value: str, setting: Named) -> str:
    return url(value, setting) or ""


def local_file(value: str, setting: Named) -> Path | None:
    """A file in the installer's own file system (in a pod: a mounted Secret or ConfigMap)."""
    value = value.strip()
    if not value:
        return None
    if not value.startswith("/"):
        raise ConfigError(f"{setting.env}={value!r} must be an absolute path")
    return Path(value)


def digests(value: str, setting: Named) -> tuple[str, ...]:
    items = tuple(v.strip().lower() for v in value.split(",") if v.strip())
    for item in items:
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", item):
            raise ConfigError(f"{setting.env}: {item!r} is not a sha256:<64 hex> digest",
                              hint="Copy the digest `installer prebuild --push` printed "
                              "(<repository>@sha256:...).")
    return items


def realms(value: str, setting: Named) -> tuple[str, ...]:
    items = tuple(v.strip().rstrip("/") for v in value.split(",") if v.strip())
    for item in items:
        if not re.fullmatch(r"https://[A-Za-z0-9.-]+(:[0-9]+)?", item):
            raise ConfigError(f"{setting.env}: {item!r} is not https://host[:port]",
                              hint="Credentials go to a token service over HTTPS only.")
    return items


def trusted_origins(value: str, setting: Named) -> tuple[str, ...]:
    """https://host[:port] origins (may be empty: only pins and digests files vouch then)."""
    items = tuple(v.strip().rstrip("/") for v in re.split(r"[,\s]+", value) if v.strip())
    for item in items:
        if not re.fullmatch(r"https://[A-Za-z0-9.-]+(:[0-9]+)?", item, re.IGNORECASE):
            raise ConfigError(f"{setting.env}: {item!r} is not https://host[:port]",
                              hint="A checksum file vouches only when TLS says who sent it: "
                              "name https origins, or use NVIDIA_DRIVER_DIGESTS_FILE.")
    return items


def seconds_or_never(value: str, setting: Named) -> float:
    """Seconds >= 0, where 0 means never."""
    number = _float(value)
    if not number >= 0 or number == float("inf"):
        raise ConfigError(f"{setting.env}={value!r} must be a number of seconds >= 0 "
                          "(0: never)")
    return number


_TAINT_PREFIX = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_TAINT_NAME = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"


def taint_key(value: str, setting: Named) -> str:
    """A taint key (a qualified name: [DNS subdomain/]name) the scheduling gate may own."""
    value = value.strip()
    prefix, _, name = value.rpartition("/")
    if not re.match(_TAINT_NAME, name) or ("/" in value and not re.match(_TAINT_PREFIX, prefix)):
        raise ConfigError(f"{setting.env}={value!r} is not a taint key ([prefix/]name, e.g. "
                          "nvidia.com/gpu.driver-not-ready)")
    if value == "nvidia.com/gpu":
        raise ConfigError(
            f"{setting.env}={value!r} cannot gate anything: Kubernetes' ExtendedResourceToleration"
            " admission gives every pod that requests nvidia.com/gpu a toleration for that key",
            hint="Use a key of its own, e.g. nvidia.com/gpu.driver-not-ready.")
    if prefix == "node.kubernetes.io":
        raise ConfigError(f"{setting.env}={value!r}: node.kubernetes.io/ taints belong to "
                          "Kubernetes' node lifecycle controller",
                          hint="Use a key of its own, e.g. nvidia.com/gpu.driver-not-ready.")
    return value
