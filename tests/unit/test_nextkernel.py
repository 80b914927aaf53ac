"""The next kernel before the reboot: which installed kernel is pending, what plan and
status say about it, and that preparing it never fails the run."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from lib.fakes import FakeRunner
from lib.hosttrees import make_host, root_env

from installer import app, nextkernel, pipeline
from installer.config import from_env
from installer.errors import ConfigError, KernelHeadersMissing
from installer.hostroot import HostRoot
from installer.layout import Layout
from installer.nextkernel import cache as nextkernel_cache
from installer.nextkernel import service as nextkernel_service
from installer.plan import Plan, Step
from installer.state import InstallRecord, write_record

V = "580.105.08"
RUNNING = "6.1.0-47-amd64"
# Not this machine's kernel: its headers in the test machine's /usr/src would count as "in
# the image".
NEXT = "6.1.0-58-amd64"


def install_kernel(root: Path, release: str, *, modules_dep: bool = True,
                   image: bool = True) -> None:
    """What a kernel package leaves: its module dir with modules.dep, its image in /boot."""
    modules = root / "lib/modules" / release
    (modules / "kernel").mkdir(parents=True, exist_ok=True)
    if modules_dep:
        (modules / "modules.dep").write_text("kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko\n")
    if image:
        (root / "boot").mkdir(exist_ok=True)
        (root / "boot" / f"vmlinuz-{release}").write_bytes(b"MZ kernel image")


def pending(root: Path, current: str = RUNNING, running: str | None = RUNNING) -> str | None:
    return nextkernel.pending_kernel(HostRoot(root), current, running)


@pytest.mark.parametrize(("candidate", "current"), [
    ("6.1.0-56-amd64", "6.1.0-47-amd64"),
    ("6.1.0-100-amd64", "6.1.0-56-amd64"),  # numbers, not text: 100 > 56
    ("6.12.9-amd64", "6.1.0-56-amd64"),
    ("5.14.0-503.11.1.el9_5.x86_64", "5.14.0-427.13.1.el9_4.x86_64"),  # a newer minor's tag
    ("5.14.0-427.13.2.el9_4.x86_64", "5.14.0-427.13.1.el9_4.x86_64"),
    ("6.8.0-51-generic", "6.8.0-45-generic"),
    ("6.8.0-1016-aws", "6.8.0-1015-aws"),
])
def test_a_later_release_of_the_same_flavour_is_newer(candidate: str, current: str) -> None:
    assert nextkernel.is_newer(candidate, current)
    assert not nextkernel.is_newer(current, candidate)


@pytest.mark.parametrize(("candidate", "current"), [
    ("6.1.0-47-amd64", "6.1.0-47-amd64"),  # equal
    ("6.1.0-56-cloud-amd64", "6.1.0-47-amd64"),  # another flavour
    ("6.1.0-56-rt-amd64", "6.1.0-47-amd64"),
    ("5.14.0-503.11.1.el9_5.x86_64+debug", "5.14.0-427.13.1.el9_4.x86_64"),
    ("6.8.0-1016-aws", "6.8.0-45-generic"),
    ("vmlinuz-extra", "6.1.0-47-amd64"),  # not a release at all
])
def test_another_flavour_or_the_same_release_is_never_newer(candidate: str, current: str) -> None:
    assert not nextkernel.is_newer(candidate, current)


def test_release_keys_split_numbers_and_flavour() -> None:
    assert nextkernel.release_key("6.1.0-56-amd64") == nextkernel.ReleaseKey((6, 1, 0, 56),
                                                                             "-amd64")
    assert nextkernel.release_key("5.14.0-427.13.1.el9_4.x86_64") == nextkernel.ReleaseKey(
        (5, 14, 0, 427, 13, 1), ".x86_64")
    assert nextkernel.release_key("lost+found") is None


def test_only_the_newest_installed_kernel_is_pending(tmp_path: Path) -> None:
    for release in (RUNNING, "6.1.0-50-amd64", "6.1.0-56-amd64", "6.1.0-53-amd64"):
        install_kernel(tmp_path, release)
    assert pending(tmp_path) == "6.1.0-56-amd64"


def test_both_files_are_required(tmp_path: Path) -> None:
    install_kernel(tmp_path, RUNNING)
    install_kernel(tmp_path, "6.1.0-56-amd64", modules_dep=False)  # removed: dir left over
    install_kernel(tmp_path, "6.1.0-57-amd64", image=False)  # image not there (yet)
    assert pending(tmp_path) is None
    install_kernel(tmp_path, "6.1.0-50-amd64")
    assert pending(tmp_path) == "6.1.0-50-amd64"


def test_older_equal_and_other_flavours_are_ignored(tmp_path: Path) -> None:
    for release in ("6.1.0-40-amd64", RUNNING, "6.1.0-56-cloud-amd64", "6.1.0-58-rt-amd64"):
        install_kernel(tmp_path, release)
    (tmp_path / "lib/modules/not-a-kernel").mkdir()
    assert pending(tmp_path) is None


def test_no_modules_dir_at_all_means_nothing_pending(tmp_path: Path) -> None:
    assert pending(tmp_path) is None


def test_building_ahead_compares_with_the_kernel_built_for(tmp_path: Path) -> None:
    # NVIDIA_KERNEL_RELEASE=6.1.0-47 on a node running 6.1.0-40: 6.1.0-56 is pending; the
    # running kernel never is, even when it is newer than the one built for.
    for release in ("6.1.0-40-amd64", RUNNING, "6.1.0-56-amd64"):
        install_kernel(tmp_path, release)
    assert pending(tmp_path, current=RUNNING, running="6.1.0-40-amd64") == "6.1.0-56-amd64"
    assert pending(tmp_path, current="6.1.0-56-amd64", running="6.1.0-40-amd64") is None
    assert pending(tmp_path, current="6.1.0-40-amd64", running="6.1.0-56-amd64") == RUNNING


def test_symlinked_module_dirs_resolve_inside_the_host_root(tmp_path: Path) -> None:
    install_kernel(tmp_path, RUNNING)
    install_kernel(tmp_path / "srv", "6.1.0-56-amd64")
    (tmp_path / "lib/modules/6.1.0-56-amd64-link").symlink_to("/srv/lib/modules/6.1.0-56-amd64")
    (tmp_path / "boot/vmlinuz-6.1.0-56-amd64-link").symlink_to(
        "/srv/boot/vmlinuz-6.1.0-56-amd64")
    assert nextkernel.is_installed(HostRoot(tmp_path), "6.1.0-56-amd64-link")


# --- plan, run and status ---------------------------------------------------------------------


def plan_for(root: Path, **env: str) -> Plan:
    if not (root / "etc/os-release").exists():
        make_host(root, distro="debian-12", kernel=RUNNING, gpus=[0x2330])
        install_kernel(root, RUNNING)
    config = from_env(root_env(root, NVIDIA_DRIVER_VERSION=V, **env))
    return app.build_plan(config, FakeRunner())


def decision(plan: Plan) -> tuple[str, str]:
    found = next(d for d in plan.decisions if d.topic == "next-kernel")
    return found.value, found.reason


def step_names(plan: Plan) -> list[str]:
    return [s.name for s in plan.steps]


def fake_build(layout: Layout, kernel: str, flavour: str = "open") -> Path:
    build = layout.module_build(V, kernel, flavour)
    build.mkdir(parents=True)
    (build / "nvidia.ko").write_bytes(b"\0version=" + V.encode() + b"\0")
    (build / ".complete").write_text(f"{V} {kernel} {flavour}\n")
    return build


def test_plan_without_a_newer_kernel_says_none_and_has_no_step(tmp_path: Path) -> None:
    plan = plan_for(tmp_path)
    assert decision(plan)[0] == "none"
    assert "no kernel newer than 6.1.0-47-amd64" in decision(plan)[1]
    assert "prepare-next-kernel" not in step_names(plan)


def test_plan_prepares_the_pending_kernel_after_the_record_before_pruning(tmp_path: Path) -> None:
    install_kernel(tmp_path, NEXT)
    plan = plan_for(tmp_path)
    value, reason = decision(plan)
    assert value == f"{NEXT}: prepared after this install"
    assert "after the driver is verified and ready" in reason
    assert "fetched from the host's package sources" in reason  # no headers on this host
    names = step_names(plan)
    assert names[-4:] == ["verify-driver", "record-install", "prepare-next-kernel",
                          "prune-cache"]


def test_plan_says_the_modules_are_ready_once_they_are_in_the_cache(tmp_path: Path) -> None:
    install_kernel(tmp_path, NEXT)
    plan = plan_for(tmp_path)
    fake_build(plan.context.layout, NEXT)
    plan = plan_for(tmp_path)
    value, reason = decision(plan)
    assert value == f"{NEXT}: modules ready"
    assert f"compiled into /var/lib/nvidia/cache/modules/{V}/{NEXT}/open" in reason
    step = next(s for s in plan.steps if s.name == "prepare-next-kernel")
    assert step.is_satisfied()


@pytest.mark.parametrize(("setting", "value"), [("off", "not prepared"),
                                                ("separate", "not prepared yet")])
def test_off_and_separate_keep_run_from_preparing(tmp_path: Path, setting: str,
                                                  value: str) -> None:
    install_kernel(tmp_path, NEXT)
    plan = plan_for(tmp_path, NVIDIA_INSTALLER_NEXT_KERNEL=setting)
    assert decision(plan)[0] == f"{NEXT}: {value}"
    assert f"NVIDIA_INSTALLER_NEXT_KERNEL={setting}" in decision(plan)[1]
    assert "prepare-next-kernel" not in step_names(plan)


def test_the_setting_is_validated() -> None:
    with pytest.raises(ConfigError, match="NVIDIA_INSTALLER_NEXT_KERNEL='later'"):
        from_env({"NVIDIA_INSTALLER_NEXT_KERNEL": "later"})
    assert from_env({}).next_kernel == "run"


def test_a_failed_preparation_warns_records_and_never_fails_the_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    install_kernel(tmp_path, NEXT)
    plan = plan_for(tmp_path)
    asked = []

    def no_headers(config: object, runner: object, kernel: str, version: str,
                   flavour: str, build: object) -> str:
        asked.append((kernel, version, flavour, build))
        raise KernelHeadersMissing(f"no headers for {NEXT} anywhere")

    monkeypatch.setattr(nextkernel_cache, "prepare", no_headers)
    step = next(s for s in plan.steps if s.name == "prepare-next-kernel")
    with caplog.at_level(logging.WARNING, logger="installer"):
        outcome = pipeline.run_step(step)
    assert outcome.status == "applied"
    assert asked == [(NEXT, V, "open", app.build_modules)]
    assert (f"next kernel {NEXT}: modules not prepared (error[kernel-headers-missing]: "
            f"no headers for {NEXT} anywhere)") in caplog.text
    record = json.loads((plan.context.layout.cache_local / "next-kernel.json").read_text())
    assert record["state"] == "failed" and record["kernel"] == NEXT
    assert record["error"] == {"reference": "kernel-headers-missing",
                               "message": f"no headers for {NEXT} anywhere"}
    # The next plan says so, and tries again.
    value, reason = decision(plan_for(tmp_path))
    assert value == f"{NEXT}: prepared after this install"
    assert "error[kernel-headers-missing]) and is retried" in reason


def test_a_bug_while_preparing_is_a_warning_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    install_kernel(tmp_path, NEXT)
    plan = plan_for(tmp_path)

    def broken(*args: object) -> str:
        raise KeyError("flavour")

    monkeypatch.setattr(nextkernel_cache, "prepare", broken)
    step = next(s for s in plan.steps if s.name == "prepare-next-kernel")
    with caplog.at_level(logging.WARNING, logger="installer"):
        pipeline.run_step(step)
    assert "error[unexpected]: KeyError: 'flavour'" in caplog.text


def test_prepare_pins_the_installed_version_flavour_and_kernel(tmp_path: Path) -> None:
    seen = []

    def build_modules(config: object, runner: object, steps: tuple[str, ...]) -> Plan:
        seen.append((config, steps))
        raise KernelHeadersMissing("stop here")

    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION="auto",
                               NVIDIA_DRIVER_SOURCE="auto"))
    with pytest.raises(KernelHeadersMissing):
        nextkernel_cache.prepare(config, FakeRunner(), NEXT, V, "proprietary", build_modules)
    ((pinned, names),) = seen
    assert (pinned.kernel_release, pinned.version, pinned.module_type, pinned.source,  # type: ignore[attr-defined]
            pinned.allow_no_gpu, pinned.next_kernel) == (  # type: ignore[attr-defined]
        NEXT, V, "proprietary", "runfile", True, "off")
    assert names == ("use-prebuilt-modules", "kernel-headers", "check-compiler",
                     "fetch-runfile", "extract-runfile", "build-modules", "publish-modules")


def never_build(config: object, runner: object, steps: object) -> Plan:
    raise AssertionError("nothing to build")


def recorded_host(root: Path, source: str = "runfile") -> Layout:
    make_host(root, distro="debian-12", kernel=RUNNING, gpus=[0x2330])
    install_kernel(root, RUNNING)
    config = from_env(root_env(root))
    layout = Layout.from_config(config, HostRoot(root))
    layout.install_local.mkdir(parents=True)
    write_record(layout.state_file, InstallRecord(V, "open", RUNNING, source, "/var/lib/nvidia"))
    return layout


def test_status_shows_the_pending_kernel_and_whether_it_is_ready(tmp_path: Path) -> None:
    layout = recorded_host(tmp_path)
    config = from_env(root_env(tmp_path))
    assert app.status(config)["next_kernel"] == {"kernel": None, "setting": "run"}
    install_kernel(tmp_path, NEXT)
    shown = app.status(config)["next_kernel"]
    assert shown == {"kernel": NEXT, "setting": "run", "modules_ready": False,
                     "modules": f"/var/lib/nvidia/cache/modules/{V}/{NEXT}/open"}
    fake_build(layout, NEXT)
    assert app.status(config)["next_kernel"]["modules_ready"] is True


def test_status_on_a_dnf_host_says_who_builds_for_the_next_kernel(tmp_path: Path) -> None:
    recorded_host(tmp_path, source="dnf")
    install_kernel(tmp_path, NEXT)
    shown = app.status(from_env(root_env(tmp_path)))["next_kernel"]
    assert shown["modules_ready"] is False
    assert "does not prepare it on dnf hosts" in shown["why"]
    extra = tmp_path / "lib/modules" / NEXT / "extra"
    extra.mkdir()
    (extra / "nvidia.ko.xz").write_bytes(b"built by dkms autoinstall")
    assert app.status(from_env(root_env(tmp_path)))["next_kernel"]["modules_ready"] is True


def test_prepare_installed_without_a_record_or_a_pending_kernel_does_nothing(
        tmp_path: Path) -> None:
    make_host(tmp_path, distro="debian-12", kernel=RUNNING, gpus=[0x2330])
    install_kernel(tmp_path, RUNNING)
    install_kernel(tmp_path, NEXT)
    runner = FakeRunner()
    said = nextkernel.prepare_installed(from_env(root_env(tmp_path)), runner, never_build)
    assert said == "no driver installed yet (no install record): nothing to prepare"
    assert not (tmp_path / "var/lib/nvidia").exists()  # not even the lock file
    off = nextkernel.prepare_installed(
        from_env(root_env(tmp_path, NVIDIA_INSTALLER_NEXT_KERNEL="off")), runner, never_build)
    assert off == "NVIDIA_INSTALLER_NEXT_KERNEL=off: nothing to do"
    assert runner.calls == []


def watch_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: Exception,
                  rounds: int) -> list[float]:
    """`rounds` rounds of the watch (10 s apart, on a posed clock) with a next kernel whose
    preparation raises `fault`: the times it was tried."""
    recorded_host(tmp_path)
    install_kernel(tmp_path, NEXT)
    clock = [1000.0]
    attempts = []

    def failing(config: object, runner: object, build: object) -> str:
        attempts.append(clock[0])
        raise fault

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setattr(nextkernel_service, "prepare_installed", failing)
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    nextkernel.watch(from_env(root_env(tmp_path)), FakeRunner(), never_build, 10.0,
                     sleep=sleep, rounds=rounds)
    return attempts


def test_watch_retries_a_failed_kernel_only_after_six_intervals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="installer"):
        attempts = watch_failing(tmp_path, monkeypatch, KernelHeadersMissing("no headers"), 14)
    assert attempts == [1000.0, 1060.0, 1120.0]
    assert caplog.text.count("error[kernel-headers-missing]: no headers") == 1  # said once


def test_watch_outlives_a_failure_nobody_foresaw_and_tries_again_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A long-running container must not die (and restart, and start over) on a fault that is
    no InstallerError: it logs it and tries that kernel again after six intervals."""
    fault = ConnectionResetError(104, "Connection reset by peer")
    with caplog.at_level(logging.INFO, logger="installer"):
        attempts = watch_failing(tmp_path, monkeypatch, fault, 8)
    assert attempts == [1000.0, 1060.0]
    assert caplog.text.count("unexpected ConnectionResetError: [Errno 104] Connection reset "
                             "by peer; tried again in 60 s") == 1


def test_with_the_upgrade_protocol_the_node_is_restored_before_the_next_kernel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from installer.cluster import protocol

    install_kernel(tmp_path, NEXT)
    plan = plan_for(tmp_path, NVIDIA_INSTALLER_UPGRADE_PROTOCOL="true", NODE_NAME="gpu-node-1")
    events: list[str] = []

    def recorded(name: str) -> Step:
        return Step(name, name, lambda: False, lambda: events.append(name))

    plan.steps = [recorded(n) for n in ("verify-driver", "record-install",
                                        "prepare-next-kernel", "prune-cache")]
    # The recorded steps never become satisfied: make run_step accept them.
    monkeypatch.setattr(pipeline, "run_step", lambda step: (step.apply(), step.name)[1])
    monkeypatch.setattr(protocol, "finish", lambda config, layout: events.append("uncordon"))
    app._execute(plan.context.config, plan.context.layout, plan)
    assert events == ["verify-driver", "record-install", "uncordon", "prepare-next-kernel",
                      "prune-cache"]
