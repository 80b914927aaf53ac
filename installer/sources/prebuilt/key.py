"""What prebuilt modules are found and trusted by: the files beside a build, the registry to
ask, the operator's trust root, the artifact key of a plan, a module's vermagic, the run's one
lookup per artifact."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Generic, Optional, TypeVar

from installer.errors import RegistryAuthFailed, RegistryUnavailable
from installer.plan import Context

if TYPE_CHECKING:
    from installer.config import Config
    from installer.delivery import ArtifactKey, Policy, RegistrySettings

ARTIFACT_MARKER = ".artifact"  # in a build dir: the modules came from this reference
EVIDENCE_FILE = ".artifact.json"  # in a build dir: the signed bytes that vouched for them
STAT_FILE = ".artifact.stat"  # size and mtime of each module when last hashed
PUBLISHED_MARKER = ".published"  # in a build dir: these modules were pushed as this reference


def registry_settings(config: Config) -> RegistrySettings | None:
    """The registry to talk to, or None. Raises RegistryAuthFailed when the password file
    cannot be read."""
    if not config.module_registry:
        return None
    from installer.delivery import RegistrySettings

    password = config.module_registry_password
    if config.module_registry_password_file is not None:
        try:
            password = config.module_registry_password_file.read_text().rstrip("\r\n")
        except OSError as exc:
            raise RegistryAuthFailed(
                f"NVIDIA_MODULE_REGISTRY_PASSWORD_FILE={config.module_registry_password_file}: "
                f"{exc.strerror or exc}") from None
    return RegistrySettings(
        repository=config.module_registry,
        plain_http=config.module_registry_plain_http,
        username=config.module_registry_username,
        password=password,
        connect_timeout=min(config.connect_timeout, 5.0),
        read_timeout=config.read_timeout,
        token_realms=config.module_registry_token_realms,
    )


def policy(ctx: Context) -> Policy | None:
    """The operator's trust root (read once per run), or None when none is configured.
    Raises TrustRootInvalid for an unreadable or empty key file."""
    if ctx.config.module_trusted_keys is None:
        return None
    found = ctx.memo.get("prebuilt-policy")
    if found is None:
        from installer.delivery import Policy, load_trust_root

        found = ctx.memo["prebuilt-policy"] = Policy(
            load_trust_root(ctx.config.module_trusted_keys), ctx.config.module_digests)
    return found  # type: ignore[no-any-return]


def artifact_key(ctx: Context) -> ArtifactKey:
    """The key of the modules this plan builds; the Secure Boot certificate names the key."""
    from installer.delivery import ArtifactKey, signing_identity

    cert = None
    if ctx.config.signing_cert is not None:
        try:
            cert = ctx.root.local(ctx.config.signing_cert).read_bytes()
        except OSError:
            cert = b"unreadable:" + str(ctx.config.signing_cert).encode()
    t = ctx.target
    return ArtifactKey(t.version, t.kernel, t.flavour, ctx.facts.arch, signing_identity(cert))


def vermagic(path: Path) -> str | None:
    """The `vermagic=` string of a kernel module (its .modinfo section), or None."""
    data = path.read_bytes()
    start = data.find(b"\0vermagic=")
    if start < 0:
        return None
    start += len(b"\0vermagic=")
    end = data.find(b"\0", start)
    return data[start:end].decode("ascii", "replace")


Found = TypeVar("Found")


class Lookup(Generic[Found]):
    """One registry lookup per run, shared by the plan's decision and the pull step: a
    registry that cannot be reached is an answer too (`error`), asked once."""

    def __init__(self, find: Callable[[], Optional[Found]]) -> None:
        self._find = find
        self.done = False
        self.artifact: Found | None = None
        self.error: RegistryUnavailable | None = None

    def get(self) -> Found | None:
        if not self.done:
            self.done = True
            try:
                self.artifact = self._find()
            except RegistryUnavailable as exc:
                self.error = exc
        return self.artifact

    def found(self) -> Found | None:
        """The artifact, or None (no such tag). Raises the lookup's RegistryUnavailable."""
        artifact = self.get()
        if self.error is not None:
            raise self.error
        return artifact


def shared_lookup(ctx: Context, name: str, find: Callable[[], Optional[Found]]) -> Lookup[Found]:
    """The run's lookup `name` (made with `find` the first time it is asked for)."""
    found = ctx.memo.get(name)
    if found is None:
        found = ctx.memo[name] = Lookup(find)
    assert isinstance(found, Lookup)
    return found
