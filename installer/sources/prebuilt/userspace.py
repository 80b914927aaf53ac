"""The user space from the registry: a node whose modules need no compile installs nvidia-smi,
the libraries and the firmware from the signed artifact of its driver version and architecture
and never downloads the `.run`; whoever publishes modules publishes it when it is missing.

Any failure (no artifact, an untrusted or malformed one, a registry error) is a warning and the
`.run` does the job as before. NVIDIA_MODULE_REQUIRE_PREBUILT is about compiling and keeps its
meaning for the modules only: the `.run` fallback for the user space compiles nothing.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from installer import safefs
from installer.dirs import is_complete, mark_complete, scratch, staged_dir
from installer.errors import ArtifactInvalid, InstallerError, RegistryUnavailable, TrustRootInvalid
from installer.plan import Context, Decision, Step
from installer.sources.installed import (
    LISTING,
    is_extracted,
    modules_built,
    read_listing,
    userspace_installed,
    write_listing,
)
from installer.sources.prebuilt.key import Lookup, policy, registry_settings, shared_lookup

if TYPE_CHECKING:
    from installer.delivery import Signer, UserspaceArtifact, UserspaceKey

log = logging.getLogger(__name__)

PULLED_MARKER = ".userspace-artifact"  # in versions/<ver>: pulled from this reference
EVIDENCE_FILE = ".userspace-artifact.json"  # the signed bytes that vouched for it
PUBLISHED_MARKER = ".userspace-published"  # the registry holds this user space


def userspace_key(ctx: Context) -> UserspaceKey:
    from installer.delivery import UserspaceKey

    return UserspaceKey(ctx.target.version, ctx.facts.arch)


def _modules_ready(ctx: Context) -> bool:
    """The modules need no .run: built or pulled into the cache, and no extracted tree at hand
    (a node that has one installs from it for free)."""
    version = ctx.target.version
    return modules_built(ctx) and not is_extracted(ctx.layout.extracted(version), version)


def _find(ctx: Context) -> UserspaceArtifact | None:
    settings, trusted = registry_settings(ctx.config), policy(ctx)
    if settings is None or trusted is None:
        return None
    from installer.delivery import userspace_artifact

    return userspace_artifact.find(settings, userspace_key(ctx), trusted)


def _lookup(ctx: Context) -> Lookup[UserspaceArtifact]:
    return shared_lookup(ctx, "userspace-lookup", lambda: _find(ctx))


def decision(ctx: Context, modules: Decision | None) -> Decision | None:
    """What `plan` says about the user space, when a registry is set and it is not installed:
    the artifact it will use (when the modules need no .run either) or the .run."""
    if not ctx.config.module_registry or userspace_installed(ctx):
        return None
    pulled = modules is not None and "@sha256:" in modules.value
    if not (pulled or _modules_ready(ctx)):
        return Decision("userspace", "the .run", "the modules are compiled from the .run, "
                        "which installs the user space too")
    if policy(ctx) is None:
        return Decision("userspace", "the .run", "NVIDIA_MODULE_TRUSTED_KEYS is unset")
    lookup = _lookup(ctx)
    artifact = lookup.get()
    key = userspace_key(ctx)
    if lookup.error is not None:
        return Decision("userspace", "the .run", f"the registry's user space is not used "
                        f"(error[{lookup.error.reference}]: {lookup.error.message})")
    if artifact is None:
        return Decision("userspace", "the .run",
                        f"no artifact {ctx.config.module_registry}:{key.tag()}")
    return Decision("userspace", artifact.reference,
                    f"signed by {artifact.signer}; {len(artifact.entries)} files installed from "
                    "the registry, the .run is not downloaded")


def _tried_once(name: str, summary: str, done: Callable[[], bool], work: Callable[[], None],
                errors: tuple[type[InstallerError], ...], warning: str) -> Step:
    """A step tried once a run (satisfied after it, or once `done`) whose `errors` only warn:
    the user space is installed (or kept) either way."""
    tried = [False]

    def satisfied() -> bool:
        return tried[0] or done()

    def apply() -> None:
        tried[0] = True
        try:
            work()
        except errors as exc:
            log.warning(warning, exc.reference, exc.message)

    return Step(name, summary, satisfied, apply)


def pull_steps(ctx: Context) -> list[Step]:
    """`pull-userspace` after the module pull and before the .run's download."""
    if not ctx.config.module_registry:
        return []

    def pull() -> None:
        if policy(ctx) is None:
            return
        artifact = _lookup(ctx).found()
        if artifact is None:
            log.info("no user-space artifact %s:%s: installing it from the .run",
                     ctx.config.module_registry, userspace_key(ctx).tag())
            return
        install(ctx, artifact)

    return [_tried_once(
        "pull-userspace", "install the user space from the registry when a trusted artifact of "
        "this version and architecture exists (else from the .run)",
        lambda: userspace_installed(ctx) or not _modules_ready(ctx), pull,
        (RegistryUnavailable,),  # untrusted and invalid artifacts too
        "user space not pulled (error[%s]: %s); installing it from the .run")]


def install(ctx: Context, artifact: UserspaceArtifact) -> Path:
    """Place a verified artifact's tree as versions/<ver>, as install-userspace would. Raises
    ArtifactInvalid, RegistryUnavailable; nothing is left behind then."""
    from installer.delivery import userspace_artifact

    settings = registry_settings(ctx.config)
    assert settings is not None
    version = ctx.target.version
    final = ctx.layout.version_dir(version)
    with staged_dir(final, suffix=".pull", within=ctx.layout.anchor_for(final)) as staging:
        size = userspace_artifact.pull(settings, artifact, staging)
        if not (staging / "lib64" / f"libnvidia-ml.so.{version}").is_file():
            raise ArtifactInvalid(f"{artifact.reference} holds no lib64/libnvidia-ml.so."
                                  f"{version}: not the user space of {version}")
        (staging / LISTING).write_text(
            json.dumps(sorted(e.path for e in artifact.entries), indent=0) + "\n")
        (staging / EVIDENCE_FILE).write_text(artifact.evidence.to_json())
        (staging / PULLED_MARKER).write_text(f"{artifact.reference}\n")
        mark_complete(staging, version + "\n")
    log.info("installed the user space of %s from %s signed by %s (%d files, %.1f MB "
             "compressed); no .run needed", version, artifact.reference, artifact.signer,
             len(artifact.entries), size / 1e6)
    return final


def publish_steps(ctx: Context) -> list[Step]:
    """`publish-userspace` after install-userspace, when pushing is on; failures only warn."""
    config = ctx.config
    if not config.module_registry or not config.module_registry_push:
        return []
    final = ctx.layout.version_dir(ctx.target.version)

    def done() -> bool:
        # A tree installed before listings were kept cannot be published: nothing to do.
        return (not is_complete(final) or not (final / LISTING).is_file()
                or (final / PUBLISHED_MARKER).is_file() or (final / PULLED_MARKER).is_file())

    def push() -> None:
        reference = publish(ctx, final)
        safefs.write_atomic(final / PUBLISHED_MARKER, f"{reference}\n",
                            anchor=ctx.layout.anchor_for(final))

    return [_tried_once(
        "publish-userspace", "push the user space to the registry, signed with the publisher "
        "key, when it has none for this version and architecture", done, push,
        (RegistryUnavailable, TrustRootInvalid),
        "user space not published (error[%s]: %s); the install goes on")]


def publish(ctx: Context, tree: Path) -> str:
    """Push the listed user space in `tree` unless the registry has a manifest at its tag;
    returns the reference. Raises RegistryUnavailable (and subclasses), TrustRootInvalid."""
    from installer.delivery import load_signer, userspace_artifact

    settings = registry_settings(ctx.config)
    paths = read_listing(tree)
    if settings is None or ctx.config.module_publisher_key is None or paths is None:
        raise RegistryUnavailable(f"nothing to publish: no registry, no publisher key or no "
                                  f"listing of the user space in {tree}")
    signer = load_signer(ctx.config.module_publisher_key)
    present = _present(ctx, signer)
    if present is not None:
        return present
    return userspace_artifact.push(settings, userspace_key(ctx), tree, paths, signer).reference


def _present(ctx: Context, signer: Signer) -> str | None:
    """The tag's reference when the registry holds this user space signed by `signer`."""
    from installer.delivery import userspace_artifact

    settings = registry_settings(ctx.config)
    assert settings is not None
    key = userspace_key(ctx)
    if not userspace_artifact.published(settings, key, signer):
        return None
    log.info("the registry has the user space %s already: not published again",
             settings.reference(key.tag()))
    return settings.reference(key.tag())


def publish_for_prebuild(ctx: Context,
                         place_userspace: Callable[[Context, Path], None]) -> str | None:
    """`installer prebuild --push`: publish the user space of this version too (from the
    installed versions/<ver>, else placed by `place_userspace`, the runfile source's, from the
    extracted tree into a scratch directory). Only warns on failure: the modules are what
    prebuild is for. Returns the reference."""
    from installer.delivery import load_signer

    try:
        final = ctx.layout.version_dir(ctx.target.version)
        if ctx.config.module_registry and ctx.config.module_publisher_key:
            present = _present(ctx, load_signer(ctx.config.module_publisher_key))
            if present is not None:
                return present
        if is_complete(final) and read_listing(final) is not None:
            return publish(ctx, final)
        with scratch(ctx.layout.cache_local / "userspace-publish",
                     within=ctx.layout.cache_anchor) as work:
            tree = work / "tree"
            tree.mkdir()
            place_userspace(ctx, tree)
            return publish(ctx, tree)
    except (RegistryUnavailable, TrustRootInvalid) as exc:
        log.warning("user space not published (error[%s]: %s)", exc.reference, exc.message)
    return None


__all__ = ["decision", "install", "publish", "publish_for_prebuild",
           "publish_steps", "pull_steps", "read_listing", "write_listing"]
