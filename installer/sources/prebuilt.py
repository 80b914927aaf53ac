"""Prebuilt kernel modules from an OCI registry: use them instead of compiling, publish a build.

A missing artifact or any registry failure is never an install failure: the node compiles, as
it would without a registry. What is pulled is verified (digests while writing, the key in the
artifact's config, each module's vermagic against the target kernel) before it takes the place
of a build in the cache, so every later step treats it exactly like modules built here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from installer.dirs import is_complete, mark_complete, staged_dir
from installer.errors import ArtifactInvalid, RegistryUnavailable
from installer.plan import Context, Decision, Step

if TYPE_CHECKING:
    from installer.config import Config
    from installer.delivery.registry import Artifact, ArtifactKey, RegistrySettings

log = logging.getLogger(__name__)

ARTIFACT_MARKER = ".artifact"  # in a build dir: the modules came from this reference
PUBLISHED_MARKER = ".published"  # in a build dir: these modules were pushed as this reference


def registry_settings(config: Config) -> RegistrySettings | None:
    if not config.module_registry:
        return None
    from installer.delivery.registry import RegistrySettings

    return RegistrySettings(
        repository=config.module_registry,
        plain_http=config.module_registry_plain_http,
        username=config.module_registry_username,
        password=config.module_registry_password,
        connect_timeout=min(config.connect_timeout, 5.0),
        read_timeout=config.read_timeout,
    )


def artifact_key(ctx: Context) -> ArtifactKey:
    """The key of the modules this plan builds; the signing certificate names the key."""
    from installer.delivery.registry import ArtifactKey, signing_identity

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


def _built(ctx: Context) -> Path | None:
    t = ctx.target
    final = ctx.layout.module_build(t.version, t.kernel, t.flavour)
    return final if is_complete(final) else None


class _Lookup:
    """One registry lookup per run, shared by the plan's decision and the pull step."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.done = False
        self.artifact: Artifact | None = None
        self.error: RegistryUnavailable | None = None

    def get(self) -> Artifact | None:
        settings = registry_settings(self.ctx.config)
        if not self.done and settings is not None:
            self.done = True
            from installer.delivery import registry

            try:
                self.artifact = registry.find(settings, artifact_key(self.ctx))
            except RegistryUnavailable as exc:
                self.error = exc
        return self.artifact


def _lookup(ctx: Context) -> _Lookup:
    found = ctx.memo.get("prebuilt-lookup")
    if found is None:
        found = ctx.memo["prebuilt-lookup"] = _Lookup(ctx)
    assert isinstance(found, _Lookup)
    return found


def decision(ctx: Context) -> Decision | None:
    """What `plan` says about prebuilt modules; looks the artifact up only when a build is
    still needed (the warm path never touches the registry)."""
    settings = registry_settings(ctx.config)
    if settings is None:
        return None
    built = _built(ctx)
    if built is not None:
        origin = (built / ARTIFACT_MARKER)
        where = origin.read_text().strip() if origin.is_file() else "compiled on this node"
        return Decision("prebuilt-modules", "not needed", f"modules already in the cache ({where})")
    lookup = _lookup(ctx)
    artifact = lookup.get()
    key = artifact_key(ctx)
    if lookup.error is not None:
        return Decision("prebuilt-modules", "unavailable",
                        f"{lookup.error.message}; the modules will be compiled")
    if artifact is None:
        return Decision("prebuilt-modules", "none",
                        f"no artifact {settings.reference(key.tag())} for this key; the modules "
                        "will be compiled" + (" and published" if ctx.config.module_registry_push
                                              else ""))
    return Decision("prebuilt-modules", artifact.reference,
                    f"artifact for {key.tag()} found (digest {artifact.digest}); pulled and "
                    "verified instead of compiling")


def pull_steps(ctx: Context) -> list[Step]:
    """`use-prebuilt-modules` before the headers and the build, when a registry is set."""
    if registry_settings(ctx.config) is None:
        return []
    lookup = _lookup(ctx)
    tried = [False]

    def satisfied() -> bool:
        return tried[0] or _built(ctx) is not None

    def apply() -> None:
        tried[0] = True
        try:
            artifact = lookup.get()
            if lookup.error is not None:
                raise lookup.error
            if artifact is None:
                log.info("no prebuilt modules for %s in %s: compiling",
                         artifact_key(ctx).tag(), ctx.config.module_registry)
                return
            use(ctx, artifact)
        except RegistryUnavailable as exc:  # includes auth failures and invalid artifacts
            log.warning("prebuilt modules not used (error[%s]: %s); compiling instead",
                        exc.reference, exc.message)

    return [Step("use-prebuilt-modules", "pull compiled modules from the registry when an "
                 "artifact matches this key (else compile)", satisfied, apply)]


def use(ctx: Context, artifact: Artifact) -> Path:
    """Pull `artifact` into the build cache as if built here. Raises ArtifactInvalid (vermagic,
    digests) or RegistryUnavailable; nothing is left in the cache then."""
    from installer.delivery import registry

    settings = registry_settings(ctx.config)
    assert settings is not None
    t = ctx.target
    final = ctx.layout.module_build(t.version, t.kernel, t.flavour)
    with staged_dir(final, suffix=".pull") as staging:
        registry.pull(settings, artifact, staging)
        for module in sorted(staging.glob("*.ko")):
            magic = vermagic(module)
            if magic is None or magic.split(" ", 1)[0] != t.kernel:
                raise ArtifactInvalid(
                    f"{module.name} from {artifact.reference} has vermagic {magic!r}, not for "
                    f"kernel {t.kernel}"
                )
        if not (staging / "nvidia.ko").is_file():
            raise ArtifactInvalid(f"{artifact.reference} holds no nvidia.ko")
        (staging / ARTIFACT_MARKER).write_text(f"{artifact.reference}\n")
        mark_complete(staging, f"{t.version} {t.kernel} {t.flavour}\n")
    log.info("using prebuilt modules %s (%s)", artifact.reference,
             ", ".join(name for name, _, _ in artifact.files))
    return final


def publish_steps(ctx: Context) -> list[Step]:
    """`publish-modules` after the build, when pushing is on; failures only warn."""
    if registry_settings(ctx.config) is None or not ctx.config.module_registry_push:
        return []
    tried = [False]

    def satisfied() -> bool:
        built = _built(ctx)
        return (tried[0] or built is None or (built / ARTIFACT_MARKER).is_file()
                or (built / PUBLISHED_MARKER).is_file())

    def apply() -> None:
        tried[0] = True
        try:
            publish(ctx)
        except RegistryUnavailable as exc:
            log.warning("modules not published (error[%s]: %s); the install goes on",
                        exc.reference, exc.message)

    return [Step("publish-modules", "push the compiled modules to the registry for other nodes",
                 satisfied, apply)]


def publish(ctx: Context) -> Artifact:
    """Push the built modules of this plan's key. Raises RegistryUnavailable (and subclasses)."""
    from installer.delivery import registry

    settings = registry_settings(ctx.config)
    built = _built(ctx)
    if settings is None or built is None:
        raise RegistryUnavailable("nothing to publish: no registry set or no modules built")
    artifact = registry.push(settings, artifact_key(ctx), sorted(built.glob("*.ko")))
    (built / PUBLISHED_MARKER).write_text(f"{artifact.reference}\n")
    return artifact
