"""The dnf source in the plan: source choice (Rocky, Oracle, Amazon Linux), the step list on EL9
and EL10, the warm probe, the stream and version chosen from the repo's module metadata, and how
dnf's failures map to errors (FakeRunner: no process runs)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest
from kit import rpm
from kit.rpm import DEFAULT_SPEC, V565, V580A, V580B, modules_yaml, precompiled_kmod
from lib import hostreleases
from lib.dnfplans import (
    KERNEL,
    add_repo_file,
    cache_metadata,
    decision,
    plan_for,
    rpm_answer,
    step,
)
from lib.fakes import FakeRunner
from lib.hosttrees import CLASS_BRIDGE, add_pci_device, make_host, root_env

from installer import pipeline, planner
from installer.config import from_env
from installer.errors import (
    ConfigError,
    FabricManagerMismatch,
    KernelHeadersMissing,
    ModuleBuildFailed,
    ModuleMetadataMissing,
    PackageManagerFailed,
    RepoUnavailable,
)
from installer.host import Distro
from installer.plan import Plan, Step
from installer.runner import Result
from installer.sources.dnf import commands
from installer.sources.dnf import metadata as dnf_metadata
from installer.sources.dnf import plan as dnf_plan
from installer.sources.dnf.commands import dnf_target


def test_auto_on_rocky_without_nvidia_repo_keeps_the_runfile(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, FakeRunner())
    value, reason = decision(plan, "source")
    assert value == "runfile"
    assert "no NVIDIA dnf repo" in reason
    assert "install-driver-packages" not in [s.name for s in plan.steps]


def test_auto_on_rocky_with_the_cuda_repo_file_picks_dnf(tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    plan = plan_for(
        tmp_path, FakeRunner(), NVIDIA_DRIVER_VERSION="580", NVIDIA_KERNEL_MODULE_TYPE="proprietary"
    )
    value, reason = decision(plan, "source")
    assert value == "dnf"
    assert "cuda-rhel9.repo" in reason and "module streams" in reason
    names = [s.name for s in plan.steps]
    assert names[names.index("add-dnf-repo") :] == [
        "add-dnf-repo",
        "check-driver-free",
        "install-driver-packages",
        "populate-install-dir",
        "unload-old-driver",
        "activate-install",
        "configure-ld-cache",
        "load-modules",
        "create-device-nodes",
        "verify-driver",
        "record-install",
        "prune-cache",
    ]
    assert "install-module-files" not in names
    assert "nvidia-driver:580 or 580-dkms" in step(plan, "install-driver-packages").summary


def test_auto_with_the_repo_url_set_picks_dnf(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, FakeRunner(), NVIDIA_DNF_REPO_URL="http://127.0.0.1:1/x.repo")
    assert decision(plan, "source")[0] == "dnf"
    assert "NVIDIA_DNF_REPO_URL is set" in decision(plan, "source")[1]


def test_runfile_forced_on_rocky_with_a_repo(tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    plan = plan_for(tmp_path, FakeRunner(), NVIDIA_DRIVER_SOURCE="runfile")
    assert decision(plan, "source") == ("runfile", "NVIDIA_DRIVER_SOURCE=runfile")


def test_dnf_forced_on_debian_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        plan_for(
            tmp_path,
            FakeRunner(),
            distro="debian-12",
            kernel="6.1.0-56-amd64",
            NVIDIA_DRIVER_SOURCE="dnf",
        )
    assert "RHEL-family" in info.value.message and "Debian" in info.value.message
    assert info.value.exit_code == 10


def test_el10_plans_packages_with_a_version_lock(tmp_path: Path) -> None:
    plan = plan_for(
        tmp_path,
        FakeRunner(),
        distro="rocky-10",
        kernel="6.12.0-55.el10.x86_64",
        NVIDIA_DRIVER_SOURCE="dnf",
        NVIDIA_DRIVER_VERSION="580.105.08",
    )
    value, reason = decision(plan, "source")
    assert value == "dnf" and "version lock" in reason and "no module streams" in reason
    names = [s.name for s in plan.steps]
    assert (
        names.index("install-driver-packages")
        < names.index("lock-driver-version")
        < names.index("populate-install-dir")
    )
    assert "EL10: no streams" in step(plan, "install-driver-packages").summary
    assert "cuda-rhel10.repo" in step(plan, "add-dnf-repo").summary


def enable_stream(root: Path, stream: str) -> None:
    state = root / "etc/dnf/modules.d/nvidia-driver.module"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(
        f"[nvidia-driver]\nname=nvidia-driver\nstream={stream}\nprofiles=default\nstate=enabled\n"
    )


INSTALLED = {
    n: "580.105.08"
    for n in ("nvidia-driver", "nvidia-driver-cuda", "nvidia-modprobe", "kmod-nvidia-latest-dkms")
}


def dkms_built(root: Path, version: str = "580.105.08") -> None:
    """What `dkms install -k KERNEL` leaves: its tree entry and the module in extra/."""
    (root / f"var/lib/dkms/nvidia/{version}/{KERNEL}/x86_64/module").mkdir(parents=True)
    extra = root / f"lib/modules/{KERNEL}/extra"
    extra.mkdir(parents=True)
    (extra / "nvidia.ko.xz").write_bytes(b"")


def test_warm_probe_adopts_the_installed_version_without_dnf(tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    enable_stream(tmp_path, "580-dkms")
    dkms_built(tmp_path)
    runner = rpm_answer(INSTALLED)
    plan = plan_for(
        tmp_path, runner, NVIDIA_DRIVER_VERSION="580", NVIDIA_KERNEL_MODULE_TYPE="proprietary"
    )
    assert plan.context.target.version == "580.126.20"  # the catalog's, until probed
    assert step(plan, "install-driver-packages").is_satisfied()
    assert plan.context.target.version == "580.105.08"  # the stream decided
    assert all(argv[0] == "rpm" for argv in runner.argvs())


@pytest.mark.parametrize(
    ("stream", "installed", "version"),
    [
        ("580-open", INSTALLED, "580"),  # other stream enabled
        ("580-dkms", {**INSTALLED, "kmod-nvidia-open-dkms": "580.105.08"}, "580"),
        ("580-dkms", {**INSTALLED, "nvidia-driver": "580.126.20"}, "580"),  # mixed versions
        ("580-dkms", INSTALLED, "580.126.20"),  # a different pin
    ],
)
def test_probe_wants_a_transaction(
    tmp_path: Path, stream: str, installed: dict[str, str], version: str
) -> None:
    add_repo_file(tmp_path)
    enable_stream(tmp_path, stream)
    plan = plan_for(
        tmp_path,
        rpm_answer(installed),
        NVIDIA_DRIVER_VERSION=version,
        NVIDIA_KERNEL_MODULE_TYPE="proprietary",
    )
    assert not step(plan, "install-driver-packages").is_satisfied()


def dnf_failing_with(output: str) -> FakeRunner:
    """No rpm installed, and every dnf call fails (exit 1) printing `output`."""
    return rpm_answer({}).on("dnf", returncode=1, output=output)


def makecache_ok(runner: FakeRunner) -> None:
    """dnf makecache succeeds; the answers added before it answer every other dnf call."""
    others = list(runner.answers)

    def answer(argv: Sequence[str]) -> Result:
        if argv[-1] == "makecache":
            return Result(tuple(argv), 0, "Metadata cache created.\n")
        for prefix, other in reversed(others):
            if tuple(argv[: len(prefix)]) == prefix:
                return other(argv)
        return Result(tuple(argv), 0, "")

    runner.answers.append((("dnf",), answer))


def test_transaction_runs_the_exact_argv_and_maps_a_conflict(tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    runner = rpm_answer({})
    runner.on(
        "dnf",
        returncode=1,
        output=(
            "Error: Transaction test error:\n  file /usr/bin/nvidia-smi conflicts between "
            "attempted installs of a and b\n"
        ),
    )
    makecache_ok(runner)
    plan = plan_for(
        tmp_path, runner, NVIDIA_DRIVER_VERSION="580.105.08", NVIDIA_KERNEL_MODULE_TYPE="open"
    )
    cache_metadata(tmp_path)
    with pytest.raises(PackageManagerFailed) as info:
        pipeline.run_step(step(plan, "install-driver-packages"))
    assert "conflicts" in info.value.message and info.value.exit_code == 50
    dnf_calls = [a for a in runner.argvs() if a[0] == "dnf"]
    assert dnf_calls[0][-1] == "makecache"
    assert dnf_calls[1:] == [
        [
            "dnf",
            f"--installroot={tmp_path}",
            "--releasever=9.4",
            # the host's repo files, paths re-rooted, in the install dir's cache
            f"--setopt=reposdir={tmp_path}/var/lib/nvidia/cache/dnf/repos.d",
            f"--setopt=cachedir={tmp_path}/var/lib/nvidia/cache/dnf",
            "--setopt=module_platform_id=platform:el9",
            "--setopt=install_weak_deps=False",
            "--setopt=skip_if_unavailable=False",
            "--disableplugin=local",
            "-y",
            "install",
            "--allowerasing",
            "--setopt=module_stream_switch=True",
            "@nvidia-driver:580-open/default",
            "nvidia-driver-580.105.08",
            "nvidia-driver-cuda-580.105.08",
            "nvidia-modprobe-580.105.08",
            "kmod-nvidia-open-dkms-580.105.08",
            f"kernel-devel-{KERNEL}",
            f"kernel-headers-{KERNEL}",
        ]
    ]


def test_unreachable_repo_during_the_transaction(tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    runner = dnf_failing_with(
        "Error: Failed to download metadata for repo 'cuda-rhel9-x86_64': Cannot download "
        "repomd.xml: All mirrors were tried\n"
    )
    plan = plan_for(tmp_path, runner, NVIDIA_DRIVER_VERSION="580")
    with pytest.raises(RepoUnavailable) as info:
        pipeline.run_step(step(plan, "install-driver-packages"))
    assert info.value.exit_code == 51 and "cuda-rhel9-x86_64" in info.value.message


def test_missing_kernel_devel_names_package_kernel_and_repos(tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    runner = dnf_failing_with(
        f"No match for argument: kernel-devel-{KERNEL}\n"
        f"Error: Unable to find a match: kernel-devel-{KERNEL}\n"
    )
    makecache_ok(runner)
    plan = plan_for(tmp_path, runner, NVIDIA_DRIVER_VERSION="580.105.08")
    cache_metadata(tmp_path)
    with pytest.raises(KernelHeadersMissing) as info:
        pipeline.run_step(step(plan, "install-driver-packages"))
    message = info.value.message
    assert f"kernel-devel-{KERNEL}" in message and f"kernel {KERNEL}" in message
    assert "cuda-rhel9-x86_64 (https://developer.download.nvidia.com" in message
    assert info.value.exit_code == 30


def test_repo_step_keeps_an_existing_repo_file(tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    plan = plan_for(tmp_path, FakeRunner())
    assert step(plan, "add-dnf-repo").is_satisfied()


OLD = "550.127.05"


def held_rocky_plan(tmp_path: Path, **env: str) -> Plan:
    """Rocky 9 with NVIDIA's repo, driver OLD loaded and /dev/nvidia0 held by the device
    plugin; the plan asks for 580."""
    from lib.hosttrees import add_process, module_line, write_driver_version, write_proc_modules

    add_repo_file(tmp_path)
    plan = plan_for(tmp_path, FakeRunner(), NVIDIA_DRIVER_VERSION="580.105.08",
                    NVIDIA_KERNEL_MODULE_TYPE="proprietary", **env)
    write_proc_modules(tmp_path, [module_line("nvidia_uvm"), module_line("nvidia", refcount=1)])
    write_driver_version(tmp_path, OLD)
    add_process(tmp_path, 4242, "nvidia-device-p", {3: "/dev/nvidia0"})
    return plan


def test_a_held_driver_is_refused_before_dnf_changes_the_hosts_packages(tmp_path: Path) -> None:
    from installer.errors import DriverInUse

    plan = held_rocky_plan(tmp_path)
    names = [s.name for s in plan.steps]
    assert names.index("check-driver-free") == names.index("install-driver-packages") - 1
    check = step(plan, "check-driver-free")
    assert not check.is_satisfied()
    with pytest.raises(DriverInUse) as caught:
        check.apply()
    assert "pid 4242 (nvidia-device-p) holds /dev/nvidia0" in caught.value.message
    assert "driver packages were left as they were" in caught.value.message
    runner = plan.context.runner
    assert isinstance(runner, FakeRunner) and runner.calls == []  # no dnf, no rpm


def test_with_the_protocol_the_room_is_made_before_the_packages_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from installer.cluster import protocol
    from installer.layout import READY_FILE

    plan = held_rocky_plan(tmp_path, NVIDIA_INSTALLER_UPGRADE_PROTOCOL="true",
                           NODE_NAME="gpu-1")
    ready = plan.context.root.local(READY_FILE)
    ready.parent.mkdir(parents=True, exist_ok=True)
    ready.write_text(f"DRIVER_VERSION={OLD}\n")
    calls = []

    def make_room(config: object, root: object, layout: object, old: str, new: str) -> None:
        calls.append((old, new))
        (tmp_path / "proc/4242/fd/3").unlink()  # the paused plugin let go

    monkeypatch.setattr(protocol, "make_room", make_room)
    check = step(plan, "check-driver-free")
    assert not check.is_satisfied()
    check.apply()
    assert calls == [(OLD, "580.105.08")]
    assert check.is_satisfied() and not ready.exists()
    runner = plan.context.runner
    assert isinstance(runner, FakeRunner) and runner.calls == []


def test_packages_already_on_the_target_need_no_free_driver(tmp_path: Path) -> None:
    plan = held_rocky_plan(tmp_path)
    from lib.hosttrees import write_driver_version

    write_driver_version(tmp_path, "580.105.08")  # the planned version is the loaded one
    assert step(plan, "check-driver-free").is_satisfied()


CATALOG_550 = "550.163.01"  # the shipped catalog's newest 550; the repo's stream need not have it


@pytest.mark.parametrize(("distro", "kernel"), [("rocky-9", KERNEL),
                                                ("rocky-10", "6.12.0-55.el10.x86_64")])
def test_before_the_first_run_plan_names_no_version_dnf_will_not_install(
    tmp_path: Path, distro: str, kernel: str
) -> None:
    """Without the repo's module metadata the catalog's version is a guess: neither
    the plan nor prune-cache may promise it."""
    from installer.app import describe_plan

    add_repo_file(tmp_path, "cuda-rhel10.repo" if distro == "rocky-10" else "cuda-rhel9.repo")
    plan = plan_for(tmp_path, rpm_answer({}), distro=distro, kernel=kernel,
                    NVIDIA_DRIVER_SOURCE="dnf", NVIDIA_DRIVER_VERSION="550",
                    NVIDIA_KERNEL_MODULE_TYPE="proprietary")
    shown = "\n".join(describe_plan(plan))
    assert CATALOG_550 not in shown, shown
    value, reason = decision(plan, "version")
    assert value.startswith("the newest in ") and value.endswith(", chosen when run")
    assert "550" in value and "not cached here yet" in reason
    assert step(plan, "prune-cache").summary.startswith("keep only the version dnf installs")
    assert plan.context.target.version_pending


def test_a_pinned_version_is_named_before_the_first_run(tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    plan = plan_for(tmp_path, FakeRunner(), NVIDIA_DRIVER_SOURCE="dnf",
                    NVIDIA_DRIVER_VERSION="550.90.07", NVIDIA_KERNEL_MODULE_TYPE="proprietary")
    assert decision(plan, "version")[0] == "550.90.07"
    assert step(plan, "prune-cache").summary.startswith("keep only 550.90.07")
    assert not plan.context.target.version_pending


def test_a_stream_the_cached_metadata_lacks_names_no_version(tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    cache_metadata(tmp_path)
    plan = plan_for(tmp_path, FakeRunner(), NVIDIA_DRIVER_SOURCE="dnf",
                    NVIDIA_DRIVER_VERSION="550", NVIDIA_KERNEL_MODULE_TYPE="proprietary")
    assert decision(plan, "dnf-stream")[0] == "unavailable"
    assert decision(plan, "version")[0] == "none"
    assert CATALOG_550 not in "\n".join(s.summary for s in plan.steps)


def test_an_nvswitch_node_gets_the_fm_profile_in_the_drivers_one_transaction(
    tmp_path: Path,
) -> None:
    add_repo_file(tmp_path)
    runner = rpm_answer({})
    runner.on("dnf", returncode=1, output="Error: stop after the argv\n")
    makecache_ok(runner)
    make_host(tmp_path, distro="rocky-9", kernel=KERNEL, gpus=[0x2330, 0x2330])
    for address in ("0000:05:00.0", "0000:06:00.0"):  # HGX H100's NVSwitches
        add_pci_device(tmp_path, address, device=0x22A3, klass=CLASS_BRIDGE)
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION="580.105.08",
                               NVIDIA_KERNEL_MODULE_TYPE="open"))
    plan = planner.make_plan(config, runner, fetch_bytes=lambda url: b"",
                             fetch_runfile=lambda *a: tmp_path)
    value, reason = decision(plan, "fabric-manager")
    assert value == "the stream's fm profile"
    assert "nvidia-driver:<stream>/fm" in reason and "2 NVSwitch function(s)" in reason
    names = [s.name for s in plan.steps]
    assert names[names.index("install-driver-packages"):names.index("unload-old-driver")] == [
        "install-driver-packages", "populate-install-dir", "install-fabricmanager"]
    assert "fetch-fabricmanager" not in names
    assert "profile fm" in step(plan, "install-driver-packages").summary
    cache_metadata(tmp_path)
    with pytest.raises(PackageManagerFailed):
        pipeline.run_step(step(plan, "install-driver-packages"))
    install = [a for a in runner.argvs() if a[0] == "dnf" and "install" in a]
    assert install[0][install[0].index("install"):] == [
        "install", "--allowerasing", "--setopt=module_stream_switch=True",
        "@nvidia-driver:580-open/fm",
        "nvidia-driver-580.105.08", "nvidia-driver-cuda-580.105.08",
        "nvidia-modprobe-580.105.08", "kmod-nvidia-open-dkms-580.105.08",
        "nvidia-fabricmanager-580.105.08",
        f"kernel-devel-{KERNEL}", f"kernel-headers-{KERNEL}"]
    # NVIDIA_FABRICMANAGER=false: the default profile, nothing of Fabric Manager.
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION="580.105.08",
                               NVIDIA_FABRICMANAGER="false"))
    plan = planner.make_plan(config, rpm_answer({}), fetch_bytes=lambda url: b"",
                             fetch_runfile=lambda *a: tmp_path)
    assert decision(plan, "fabric-manager")[0] == "off"
    assert "install-fabricmanager" not in [s.name for s in plan.steps]
    assert "profile fm" not in step(plan, "install-driver-packages").summary


FM_FILES = {  # NVIDIA's Fabric Manager package (yum-packaging-fabric-manager's %files)
    "/usr/bin/nv-fabricmanager": "#!/bin/sh\n",
    "/usr/bin/nvswitch-audit": "#!/bin/sh\n",
    "/usr/lib/systemd/system/nvidia-fabricmanager.service": "[Unit]\n",
    "/usr/share/nvidia/nvswitch/fabricmanager.cfg": "LOG_LEVEL=4\nDAEMONIZE=1\n",
    "/usr/share/nvidia/nvswitch/dgxh100_hgxh100_topology": "topology\n",
    "/usr/share/doc/nvidia-fabricmanager/LICENSE": "license\n",
}


def fm_package_runner(root: Path, installed: dict[str, str], says: str) -> FakeRunner:
    """rpm -q answers from `installed`, rpm -ql lists FM_FILES, nv-fabricmanager --version
    says `says`."""
    runner = rpm_answer(installed)
    staged = root / "var/lib/nvidia/cache/tmp/fabricmanager/bin/nv-fabricmanager"
    runner.answers.append(((str(staged),), lambda argv: Result(
        tuple(argv), 0, f"Fabric Manager version is : {says}\n")))
    base = rpm_answer({}).answers[0][0]
    plain = runner.answers[0][1]

    def rpm(argv: Sequence[str]) -> Result:
        if "-ql" in argv:
            return Result(tuple(argv), 0, "\n".join(FM_FILES) + "\n")
        return plain(argv)

    runner.answers.append((base, rpm))
    return runner


def test_fabric_manager_from_the_package_goes_into_the_version_dir(tmp_path: Path) -> None:
    version = "580.105.08"
    add_repo_file(tmp_path)
    make_host(tmp_path, distro="rocky-9", kernel=KERNEL, gpus=[0x2330])
    add_pci_device(tmp_path, "0000:05:00.0", device=0x22A3, klass=CLASS_BRIDGE)
    for path, text in FM_FILES.items():
        (tmp_path / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path.lstrip("/")).write_text(text)

    def install_step(installed: dict[str, str], says: str = version) -> Step:
        config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION=version))
        plan = planner.make_plan(config, fm_package_runner(tmp_path, installed, says),
                                 fetch_bytes=lambda url: b"", fetch_runfile=lambda *a: tmp_path)
        return step(plan, "install-fabricmanager")

    with pytest.raises(FabricManagerMismatch, match="nvidia-fabricmanager is not installed"):
        pipeline.run_step(install_step({}))
    with pytest.raises(FabricManagerMismatch,
                       match=r"is 580\.126\.20, not the driver's 580\.105\.08"):
        pipeline.run_step(install_step({"nvidia-fabricmanager": "580.126.20"}))
    with pytest.raises(FabricManagerMismatch, match=r"says it is 575\.57\.08: it would refuse"):
        pipeline.run_step(install_step({"nvidia-fabricmanager": version}, says="575.57.08"))
    versions = tmp_path / "var/lib/nvidia/versions" / version
    assert not (versions / "bin/nv-fabricmanager").exists()
    done = install_step({"nvidia-fabricmanager": version})
    assert not done.is_satisfied()
    pipeline.run_step(done)
    assert done.is_satisfied()
    assert sorted(str(p.relative_to(versions)) for p in versions.rglob("*") if p.is_file()) == [
        "bin/nv-fabricmanager", "bin/nvswitch-audit",
        "share/nvidia/nvswitch/.fabricmanager-version",
        "share/nvidia/nvswitch/dgxh100_hgxh100_topology",
        "share/nvidia/nvswitch/fabricmanager.cfg"]
    assert (versions / "share/nvidia/nvswitch/fabricmanager.cfg").read_text() == (
        FM_FILES["/usr/share/nvidia/nvswitch/fabricmanager.cfg"])


def test_oracle_with_nvidias_rhel_repo_gets_the_dnf_source_and_uek_devel(
        tmp_path: Path) -> None:
    uek = hostreleases.release("ol-9.6").kernels[0]
    add_repo_file(tmp_path)
    plan = plan_for(tmp_path, FakeRunner(), distro="ol-9", kernel=uek.release,
                    NVIDIA_DRIVER_VERSION="580", NVIDIA_KERNEL_MODULE_TYPE="open")
    assert decision(plan, "source")[0] == "dnf"
    assert "module streams" in decision(plan, "source")[1]
    assert decision(plan, "kernel-headers")[0] == uek.headers_package
    assert decision(plan, "dnf-stream")[0] == "nvidia-driver:580-open"
    assert decision(plan, "image-tag")[0] == "rocky9"


def test_amazon_linux_takes_nvidias_amzn2023_repo_as_the_dnf_source(tmp_path: Path) -> None:
    kernel = hostreleases.release("amzn-2023").kernels[0].release
    bare = plan_for(tmp_path / "bare", FakeRunner(), distro="amzn-2023", kernel=kernel,
                    NVIDIA_DRIVER_VERSION="580.105.08")
    assert decision(bare, "source")[0] == "runfile"
    assert decision(bare, "headers-package")[0] == f"kernel-devel-{kernel}"
    add_repo_file(tmp_path, "cuda-amzn2023.repo")
    plan = plan_for(tmp_path, FakeRunner(), distro="amzn-2023", kernel=kernel,
                    NVIDIA_DRIVER_VERSION="580.105.08")
    assert decision(plan, "source")[0] == "dnf"
    assert "module streams" in decision(plan, "source")[1]
    assert decision(plan, "kernel-headers")[0] == f"kernel-devel-{kernel}"
    assert decision(plan, "dnf-stream")[0] == "nvidia-driver:580-open"  # an H100: open
    forced = plan_for(tmp_path / "forced", FakeRunner(), distro="amzn-2023", kernel=kernel,
                      NVIDIA_DRIVER_SOURCE="dnf", NVIDIA_DRIVER_VERSION="580")
    assert decision(forced, "source")[0] == "dnf"


# --- the stream and version chosen from the repo's module metadata, the plan showing what dnf
# installs, and a DKMS failure: ModuleBuildFailed with make.log's tail and the transaction undone

ROCKY9 = Distro("rocky", "9.4", 9, "rhel", "Rocky Linux 9.4")
STREAMS = dnf_metadata.parse(modules_yaml(DEFAULT_SPEC))


def test_metadata_lists_versions_and_packages_per_stream() -> None:
    assert STREAMS.versions("580-dkms") == [V580A, V580B]
    assert STREAMS.versions("580") == [V580B]
    assert STREAMS.has("580", V580B, precompiled_kmod(V580B, rpm.KERNEL))
    assert STREAMS.has("580-dkms", V580A, "kmod-nvidia-latest-dkms")


def test_precompiled_is_preferred_for_a_kernel_nvidia_built_for() -> None:
    dt = dnf_target(ROCKY9, "branch", "580", V580B, 580, "proprietary")
    choice = dnf_plan.choose(dt, rpm.KERNEL, STREAMS)
    assert (choice.stream, choice.version, choice.precompiled) == ("580", V580B, True)
    assert choice.kmod == "kmod-nvidia-580.126.20-6.1.0-56"


@pytest.mark.parametrize(
    ("kind", "value", "flavour", "kernel", "stream", "version"),
    [
        ("branch", "580", "proprietary", "6.1.0-99.el9.x86_64", "580-dkms", V580B),  # no kmod
        ("exact", V580A, "proprietary", rpm.KERNEL, "580-dkms", V580A),  # not in stream 580
        ("branch", "580", "open", rpm.KERNEL, "580-open", V580B),
        ("alias", "latest", "proprietary", "6.1.0-99.el9.x86_64", "latest-dkms", V580B),
    ],
)
def test_dkms_otherwise(
    kind: str, value: str, flavour: str, kernel: str, stream: str, version: str
) -> None:
    dt = dnf_target(ROCKY9, kind, value, value if kind == "exact" else "610.43.02", 580, flavour)
    choice = dnf_plan.choose(dt, kernel, STREAMS)
    assert (choice.stream, choice.version, choice.precompiled) == (stream, version, False)
    assert choice.reason.startswith(f"DKMS stream {stream}: ")


def test_a_pin_the_repo_lacks_is_module_metadata_missing() -> None:
    dt = dnf_target(ROCKY9, "exact", "580.1.2", "580.1.2", 580, "proprietary")
    with pytest.raises(ModuleMetadataMissing) as info:
        dnf_plan.choose(dt, rpm.KERNEL, STREAMS)
    assert "580.1.2" in info.value.message and info.value.exit_code == 53


def test_plan_shows_the_version_dnf_installs_not_the_catalogs(tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    cache_metadata(tmp_path)
    plan = plan_for(tmp_path, FakeRunner(), NVIDIA_DRIVER_VERSION="latest",
                    NVIDIA_KERNEL_MODULE_TYPE="proprietary")
    assert decision(plan, "version")[0] == V580B  # the catalog's latest is newer
    value, reason = decision(plan, "dnf-stream")
    assert value == "nvidia-driver:latest-dkms" and "no precompiled kmod" in reason


@pytest.mark.parametrize(("flavour", "dkms_name"), [("proprietary", "nvidia"),
                                                   ("open", "nvidia-open")])
def test_dkms_failure_is_module_build_failed_and_undoes_the_transaction(
    tmp_path: Path, flavour: str, dkms_name: str
) -> None:
    """NVIDIA's open -dkms kmod of 565 registers as nvidia-open (/usr/src/nvidia-open-<v>): DKMS
    is asked about, and builds, that name, and its make.log is the one quoted."""
    add_repo_file(tmp_path)
    make_log = tmp_path / f"var/lib/dkms/{dkms_name}/{V565}/build/make.log"

    def dnf_answer(argv: Sequence[str]) -> Result:
        if "install" in argv:  # the transaction: dnf records it in its history
            history = tmp_path / "var/lib/dnf/history.sqlite"
            history.parent.mkdir(parents=True, exist_ok=True)
            with sqlite3.connect(history) as db:
                db.execute("CREATE TABLE IF NOT EXISTS trans (id INTEGER PRIMARY KEY)")
                db.execute("INSERT INTO trans (id) VALUES (7)")
        return Result(tuple(argv), 0, "Complete!\n")

    def dkms_answer(argv: Sequence[str]) -> Result:
        if "install" in argv:
            make_log.parent.mkdir(parents=True, exist_ok=True)
            make_log.write_text("make[2]: *** No rule to make target 'nvidia-uvm.o_binary'\n")
            return Result(tuple(argv), 10, "Error! Bad return status for module build\n")
        return Result(tuple(argv), 0, "")

    runner = rpm_answer({})
    runner.answers.append((("dnf",), dnf_answer))
    runner.answers.append((("chroot",), dkms_answer))
    plan = plan_for(tmp_path, runner, NVIDIA_DRIVER_VERSION="565",
                    NVIDIA_KERNEL_MODULE_TYPE=flavour)
    cache_metadata(tmp_path)
    with pytest.raises(ModuleBuildFailed) as info:
        pipeline.run_step(step(plan, "install-driver-packages"))
    message = info.value.message
    assert "No rule to make target" in message
    assert f"/var/lib/dkms/{dkms_name}/{V565}/build/make.log" in message
    assert f"DKMS could not build {dkms_name} {V565} for kernel " in message
    assert info.value.exit_code == 31
    argvs = runner.argvs()
    assert [str(tmp_path), "dkms", "status", "-m", dkms_name, "-v", V565, "-k"] == (
        argvs[-3][1:9])
    assert [str(tmp_path), "dkms", "install", "-m", dkms_name, "-v", V565, "-k"] == (
        argvs[-2][1:9])
    assert argvs[-1][-3:] == ["history", "undo", "7"]


@pytest.mark.parametrize(("flavour", "version", "name"), [
    ("open", "565.57.01", "nvidia-open"), ("open", "570.133.20", "nvidia-open"),
    ("open", "570.148.08", "nvidia"), ("open", "580.105.08", "nvidia"),
    ("proprietary", "565.57.01", "nvidia"), ("proprietary", "580.105.08", "nvidia")])
def test_the_open_kmod_registers_with_dkms_as_nvidia_from_570_148_08(
        flavour: str, version: str, name: str) -> None:
    assert commands.dkms_name(flavour, version) == name


def test_epel_is_added_only_when_the_setting_asks_and_none_is_enabled(tmp_path: Path) -> None:
    add_repo_file(tmp_path)
    runner = dnf_failing_with("No match for argument: epel-release\n")
    plan = plan_for(tmp_path, runner, NVIDIA_DNF_ENABLE_EPEL="true")
    names = [s.name for s in plan.steps]
    assert names.index("enable-epel") == names.index("add-dnf-repo") + 1
    epel = step(plan, "enable-epel")
    assert not epel.is_satisfied()
    with pytest.raises(RepoUnavailable) as info:
        pipeline.run_step(epel)
    assert info.value.exit_code == 51 and "epel-release" in info.value.message
    assert runner.argvs()[-1][-2:] == ["install", "epel-release"]
    (tmp_path / "etc/yum.repos.d/epel.repo").write_text(
        "[epel]\nbaseurl=https://dl.fedoraproject.org/pub/epel/9/Everything/x86_64/\n"
    )
    assert epel.is_satisfied()
