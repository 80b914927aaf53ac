"""What `installer plan` states about the host's platform (the release's headers package and image
tag, the architecture, the kernel's flavour and page size) and the refusal of a driver known to
fault on 64k-page kernels."""

from __future__ import annotations

import logging

from installer import distros
from installer.errors import PageSizeRisk
from installer.headers import compiler, steps
from installer.host import pagesize
from installer.plan import Context, Decision

log = logging.getLogger(__name__)

# 590.44.01 and later fault with Xid 31 on GPU mappings of 4 GiB or more on 64k-page kernels,
# where 580's open modules run (open-gpu-kernel-modules #1269).
FAULTS_FROM = (590, 44, 1)
FAULTS_FROM_TEXT = "590.44.01"
FAULT_ISSUE = "open-gpu-kernel-modules #1269"
PAGES_64K = 65536
ALLOW = "NVIDIA_INSTALLER_ALLOW_64K_PAGE_RISK"


def page_size(ctx: Context) -> pagesize.PageSize:
    t = ctx.target
    trees = [steps.local_tree(ctx, t.headers)] if t.headers is not None else []
    return pagesize.kernel_page_size(ctx.root, t.kernel, ctx.facts.arch, trees)


def _faults(ctx: Context) -> bool:
    t = ctx.target
    if t.version_pending:  # dnf picks the newest of the branch when run
        return t.branch >= FAULTS_FROM[0]
    try:
        version = tuple(int(p) for p in t.version.split("."))
    except ValueError:
        return t.branch >= FAULTS_FROM[0]
    return version >= FAULTS_FROM


def risk(ctx: Context, pages: pagesize.PageSize) -> str | None:
    """Why the planned driver is known to fail on this kernel's pages, or None."""
    if pages.size != PAGES_64K or not _faults(ctx):
        return None
    return (f"driver {ctx.target.version} on a 64k-page kernel: drivers from "
            f"{FAULTS_FROM_TEXT} on "
            "fault with Xid 31 on GPU mappings of 4 GiB or more there (" + FAULT_ISSUE + "); "
            "580's open modules run there")


def refusal(ctx: Context) -> PageSizeRisk | None:
    """driver-64k-page-risk unless the operator accepted it (then a warning). Reads only."""
    why = risk(ctx, page_size(ctx))
    if why is None:
        return None
    if ctx.config.allow_64k_page_risk:
        log.warning("%s; installing anyway (%s=true)", why, ALLOW)
        return None
    return PageSizeRisk(f"refusing {why}")


def decisions(ctx: Context) -> list[Decision]:
    facts, t = ctx.facts, ctx.target
    family = distros.of(facts.distro)
    flavour = family.kernel_flavour(t.kernel)
    out = [Decision("headers-package", family.headers_package(t.kernel),
                    f"{facts.distro}'s package of exactly kernel {t.kernel}'s headers (the "
                    f"{flavour} flavour kept)"),
           _image_tag(ctx, family)]
    # Named, not cut from the URL: a mirror's URL may carry credentials in its query.
    run = f"NVIDIA-Linux-{facts.arch}-{t.version}.run" if t.urls else ""
    out.append(Decision("architecture", facts.arch, "the host kernel's machine"
                        + (f"; NVIDIA's .run for it: {run}" if run else "")))
    out.append(Decision("kernel-flavour", flavour, f"from the kernel release {t.kernel}"))
    pages = page_size(ctx)
    why = risk(ctx, pages)
    reason = f"from {pages.source}"
    if why is not None:
        reason += (f"; warning: {why}; `run` "
                   + (f"installs anyway ({ALLOW}=true)" if ctx.config.allow_64k_page_risk else
                      f"refuses (driver-64k-page-risk) unless {ALLOW}=true"))
    elif pages.size == PAGES_64K:
        reason += f"; driver {t.version} predates the 64k-page faults of {FAULT_ISSUE}"
    out.append(Decision("page-size", str(pages), reason))
    return out


def _image_tag(ctx: Context, family: distros.Family) -> Decision:
    distro = ctx.facts.distro
    tag = family.image_tag(distro)
    carried = compiler.IMAGE_COMPILERS.get(tag)
    if carried is None:
        return Decision("image-tag", f"{tag} (not built)",
                        f"no installer image is built for {distro} yet; build one from images/")
    majors = "/".join(str(m) for m in carried)
    reason = (f"the installer image for {distro} (its userland no older than the host's; "
              f"gcc {majors})")
    major, source = steps.kernel_gcc(ctx)
    if major is None:
        return Decision("image-tag", tag, reason + "; the kernel's gcc is read from its headers")
    reason += f"; kernel built with gcc {major} ({source})"
    if major not in carried:
        others = compiler.tags_with(major)
        reason += (f": not in this image's default set; installed from its package sources "
                   f"when offered, else use {' or '.join(others) or 'an image built with it'}")
    return Decision("image-tag", tag, reason)
