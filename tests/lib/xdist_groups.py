"""Which tests share an xdist worker, and in what order the groups are handed out.

CI runs the suite on two workers (`-n 2`, README). Each file is a group: its module fixtures, a
vm scenario's boots among them, run once, on one worker. NVIDIA's real compile is one group of
three files that share one build (lib/realdriver.py); the arm64 files (NVIDIA's arm64 modules
cross-built, the arm64 guest) another (lib/arm64kit.py packs the aarch64 .run once per worker).
The longest groups are handed out first, so that neither worker is left with a long one at the
end.

The grouping is our own scheduler (xdist's public `pytest_xdist_make_scheduler` hook), keyed by
the file's path: xdist's `--dist loadgroup` renames each node id with an `@group` suffix, which
pytest 9.2 no longer reads (`Node.nodeid` is derived from `_id`), so with it every group was
silently split across both workers, and two workers ran one module's fixture at once on one
cache (two buildah builds in one storage).
"""

from __future__ import annotations

from typing import Any

REAL_DRIVER_FILES = ("integration/test_real_driver.py", "integration/test_real_registry.py",
                     "vm/test_real_driver_vm.py")
ARM64_FILES = ("integration/test_cross_build.py", "vm/test_arm64_vm.py",
               "vm/test_arm64_node_vm.py")
LONG_GROUPS = ("vm/test_pod_scenarios.py", "real-driver", "arm64", "pod/test_multiarch_image.py",
               "integration/test_real_driver_trixie.py",
               "vm/test_installer_scenarios.py",
               "vm/test_headers_fetched.py", "vm/test_upgrade_protocol.py",
               "vm/test_next_kernel_vm.py", "vm/test_dnf_scenario.py", "vm/test_prebuilt_vm.py",
               "integration/test_host_releases_run.py")


def group_of(path: str) -> str:
    """The group of a test file, given as a path relative to tests/."""
    if path in ARM64_FILES:
        return "arm64"
    return "real-driver" if path in REAL_DRIVER_FILES else path


def group_of_nodeid(nodeid: str) -> str:
    """The group of a test by its node id (`tests/vm/test_x.py::test_y[param]`, relative to the
    rootdir, or to tests/ where pytest was started there)."""
    path = nodeid.split("::", 1)[0]
    return group_of(path.removeprefix("tests/"))


def long_first(nodeids: list[str]) -> list[str]:
    """`nodeids` with the long groups first, in LONG_GROUPS' order; the rest keep theirs."""
    order = {name: index for index, name in enumerate(LONG_GROUPS)}
    return sorted(nodeids, key=lambda nodeid: order.get(group_of_nodeid(nodeid), len(order)))


def make_scheduler(config: Any, log: Any) -> Any:
    """xdist's scope scheduler with our groups as its scopes; xdist imported only under `-n`."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of_nodeid(nodeid)

    return GroupScheduling(config, log)
