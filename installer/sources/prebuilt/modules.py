"""Prebuilt kernel modules from an OCI registry: use them instead of compiling, publish a build.

A pulled artifact is used only when a publisher key the operator trusts signed its manifest
digest (NVIDIA_MODULE_TRUSTED_KEYS; with none, nothing pulled is ever used) and, when pins are
set, its digest is pinned; then every digest, NVIDIA's module names and each module's vermagic
are checked before it takes the place of a build in the cache. The signed bytes stay beside the
modules, and a cached pulled build is checked again (signature against the trust root of the
day, pins, names, contents) before every run uses it. A missing, untrusted or unreachable
artifact costs a compile, never an install, unless NVIDIA_MODULE_REQUIRE_PREBUILT says so.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from installer import safefs
from installer.dirs import is_complete, mark_complete, remove_tree, staged_dir
from installer.errors import (
    ArtifactInvalid,
    PrebuiltRequired,
    RegistryUnavailable,
)
from installer.plan import Context, Decision, Step
from installer.sources.prebuilt.cache import cached_problem
from installer.sources.prebuilt.key import (
    ARTIFACT_MARKER,
    EVIDENCE_FILE,
    PUBLISHED_MARKER,
    STAT_FILE,
    Lookup,
    artifact_key,
    policy,
    registry_settings,
    shared_lookup,
    vermagic,
)

if TYPE_CHECKING:
    from installer.delivery import Artifact

log = logging.getLogger(__name__)

def _build_dir(ctx: Context) -> Path:
    t = ctx.target
    return ctx.layout.module_build(t.version, t.kernel, t.flavour)


def _built(ctx: Context) -> Path | None:
    final = _build_dir(ctx)
    return final if is_complete(final) else None


def _pulled(build: Path) -> bool:
    return (build / ARTIFACT_MARKER).is_file() or (build / EVIDENCE_FILE).is_file()


# --------------------------------------------------------------------------- the lookup


def _find(ctx: Context) -> Artifact | None:
    settings = registry_settings(ctx.config)
    trusted = policy(ctx)
    if settings is None or trusted is None:
        return None
    from installer.delivery import registry

    return registry.find(settings, artifact_key(ctx), trusted)


def _lookup(ctx: Context) -> Lookup[Artifact]:
    return shared_lookup(ctx, "prebuilt-lookup", lambda: _find(ctx))


def decision(ctx: Context) -> Decision | None:
    """What `plan` says about prebuilt modules; looks the artifact up only when a build is
    still needed and a trust root is set (the warm path never touches the registry)."""
    config = ctx.config
    built = _built(ctx)
    if built is not None and _pulled(built):
        where = (built / ARTIFACT_MARKER).read_text().strip() if (
            built / ARTIFACT_MARKER).is_file() else "a registry"
        problem = cached_problem(ctx, built)
        if problem is None:
            return Decision("prebuilt-modules", "not needed",
                            f"modules already in the cache (pulled from {where}; their "
                            "signature verified again)")
        return Decision("prebuilt-modules", "cache dropped",
                        f"the cached modules pulled from {where} are not used: {problem}")
    if not config.module_registry:
        return None
    if built is not None:
        return Decision("prebuilt-modules", "not needed",
                        "modules already in the cache (compiled on this node)")
    fails = " and the run fails (NVIDIA_MODULE_REQUIRE_PREBUILT)" if (
        config.module_require_prebuilt) else "; the modules will be compiled"
    if policy(ctx) is None:
        return Decision("prebuilt-modules", "not trusted",
                        "NVIDIA_MODULE_TRUSTED_KEYS is unset: no pulled artifact is used and "
                        "the registry is not asked" + fails)
    lookup = _lookup(ctx)
    artifact = lookup.get()
    if lookup.error is not None:
        value = "untrusted" if lookup.error.reference in (
            "artifact-untrusted", "artifact-invalid") else "unavailable"
        return Decision("prebuilt-modules", value,
                        f"error[{lookup.error.reference}]: {lookup.error.message}{fails}")
    key = artifact_key(ctx)
    if artifact is None:
        push = " and published" if config.module_registry_push else ""
        return Decision("prebuilt-modules", "none",
                        f"no artifact {config.module_registry}:{key.tag()} for this key"
                        + (fails if config.module_require_prebuilt else
                           f"; the modules will be compiled{push}"))
    return Decision("prebuilt-modules", artifact.reference,
                    f"artifact for {key.tag()} found (digest {artifact.digest}, signed by "
                    f"{artifact.signer}); pulled and verified instead of compiling")


# --------------------------------------------------------------------------- steps


def pull_steps(ctx: Context) -> list[Step]:
    """`use-prebuilt-modules` before the headers and the build, when a registry is set or a
    pulled build sits in the cache (it is checked again, and dropped when it fails)."""
    pulled_in_cache = (_build_dir(ctx) / ARTIFACT_MARKER).exists() or (
        _build_dir(ctx) / EVIDENCE_FILE).exists()
    if not ctx.config.module_registry and not pulled_in_cache:
        return []
    tried = [False]

    def satisfied() -> bool:
        if tried[0]:
            return True
        built = _built(ctx)
        if built is None:
            return not ctx.config.module_registry
        return not _pulled(built) or cached_problem(ctx, built) is None

    def apply() -> None:
        tried[0] = True
        built = _built(ctx)
        if built is not None and _pulled(built):
            problem = cached_problem(ctx, built)
            if problem is None:
                return
            log.warning("the cached modules in %s are not used: %s; removed", built, problem)
            remove_tree(built)
            ctx.memo.pop("prebuilt-cached", None)
        if not ctx.config.module_registry:
            return
        _pull_or_compile(ctx)

    return [Step("use-prebuilt-modules", "pull compiled modules from the registry when a "
                 "trusted artifact matches this key (else compile)", satisfied, apply)]


def _pull_or_compile(ctx: Context) -> None:
    config = ctx.config
    try:
        if policy(ctx) is None:
            log.info("NVIDIA_MODULE_TRUSTED_KEYS is unset: no pulled artifact is used; "
                     "compiling")
            return
        artifact = _lookup(ctx).found()
        if artifact is None:
            message = (f"no prebuilt modules for {artifact_key(ctx).tag()} in "
                       f"{config.module_registry}")
            if config.module_require_prebuilt:
                raise PrebuiltRequired(message)
            log.info("%s: compiling", message)
            return
        use(ctx, artifact)
    except RegistryUnavailable as exc:  # auth, realm, untrusted and invalid artifacts too
        if config.module_require_prebuilt:
            raise PrebuiltRequired(f"prebuilt modules not used (error[{exc.reference}]: "
                                   f"{exc.message})") from None
        log.warning("prebuilt modules not used (error[%s]: %s); compiling instead",
                    exc.reference, exc.message)


def use(ctx: Context, artifact: Artifact) -> Path:
    """Pull a verified `artifact` into the build cache as if built here, with its signed
    record. Raises ArtifactInvalid (vermagic, digests, other files) or RegistryUnavailable;
    nothing is left in the cache then."""
    from installer.delivery import MODULE_NAMES, registry

    settings = registry_settings(ctx.config)
    assert settings is not None
    t = ctx.target
    final = _build_dir(ctx)
    with staged_dir(final, suffix=".pull", within=ctx.layout.anchor_for(final)) as staging:
        registry.pull(settings, artifact, staging)
        names = sorted(p.name for p in staging.iterdir())
        if not set(names) <= MODULE_NAMES or "nvidia.ko" not in names:
            raise ArtifactInvalid(f"{artifact.reference} gave {names}, not NVIDIA's modules")
        stats: dict[str, list[int]] = {}
        for module in sorted(staging.glob("*.ko")):
            magic = vermagic(module)
            if magic is None or magic.split(" ", 1)[0] != t.kernel:
                raise ArtifactInvalid(
                    f"{module.name} from {artifact.reference} has vermagic {magic!r}, not for "
                    f"kernel {t.kernel}"
                )
            info = module.stat()
            stats[module.name] = [info.st_size, info.st_mtime_ns]
        (staging / EVIDENCE_FILE).write_text(artifact.evidence.to_json())
        (staging / STAT_FILE).write_text(json.dumps(stats, sort_keys=True) + "\n")
        (staging / ARTIFACT_MARKER).write_text(f"{artifact.reference}\n")
        mark_complete(staging, f"{t.version} {t.kernel} {t.flavour}\n")
    log.info("using prebuilt modules %s signed by %s (%s)", artifact.reference, artifact.signer,
             ", ".join(f.name for f in artifact.files))
    return final


def publish_steps(ctx: Context) -> list[Step]:
    """`publish-modules` after the build, when pushing is on; failures only warn."""
    if not ctx.config.module_registry or not ctx.config.module_registry_push:
        return []
    tried = [False]

    def satisfied() -> bool:
        built = _built(ctx)
        return (tried[0] or built is None or _pulled(built)
                or (built / PUBLISHED_MARKER).is_file())

    def apply() -> None:
        tried[0] = True
        try:
            publish(ctx)
        except RegistryUnavailable as exc:
            log.warning("modules not published (error[%s]: %s); the install goes on",
                        exc.reference, exc.message)

    return [Step("publish-modules", "push the compiled modules to the registry, signed with "
                 "the publisher key", satisfied, apply)]


def publish(ctx: Context) -> Artifact:
    """Push and sign the built modules of this plan's key. Raises RegistryUnavailable (and
    subclasses), TrustRootInvalid (the publisher key)."""
    from installer.delivery import load_signer, registry

    settings = registry_settings(ctx.config)
    built = _built(ctx)
    if settings is None or built is None or ctx.config.module_publisher_key is None:
        raise RegistryUnavailable("nothing to publish: no registry, no publisher key or no "
                                  "modules built")
    signer = load_signer(ctx.config.module_publisher_key)
    artifact = registry.push(settings, artifact_key(ctx), sorted(built.glob("*.ko")), signer)
    safefs.write_atomic(built / PUBLISHED_MARKER, f"{artifact.reference}\n",
                        anchor=ctx.layout.anchor_for(built))
    return artifact
