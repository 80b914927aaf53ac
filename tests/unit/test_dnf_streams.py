"""Choosing the stream and version from the repo's module metadata, the plan showing what dnf
installs, and a DKMS failure: ModuleBuildFailed with make.log's tail and the transaction undone."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest
from kit.rpm import DEFAULT_SPEC, KERNEL, V565, V580A, V580B, modules_yaml, precompiled_kmod
from lib.dnfplans import add_repo_file, cache_metadata, decision, plan_for, rpm_answer, step
from lib.fakes import FakeRunner

from installer import pipeline
from installer.errors import ModuleBuildFailed, ModuleMetadataMissing, RepoUnavailable
from installer.host import Distro
from installer.runner import Result
from installer.sources.dnf import commands
from installer.sources.dnf import metadata as dnf_metadata
from installer.sources.dnf import plan as dnf_plan
from installer.sources.dnf.commands import dnf_target

ROCKY9 = Distro("rocky", "9.4", 9, "rhel", "Rocky Linux 9.4")
STREAMS = dnf_metadata.parse(modules_yaml(DEFAULT_SPEC))


def test_metadata_lists_versions_and_packages_per_stream() -> None:
    assert STREAMS.versions("580-dkms") == [V580A, V580B]
    assert STREAMS.versions("580") == [V580B]
    assert STREAMS.has("580", V580B, precompiled_kmod(V580B, KERNEL))
    assert STREAMS.has("580-dkms", V580A, "kmod-nvidia-latest-dkms")


def test_precompiled_is_preferred_for_a_kernel_nvidia_built_for() -> None:
    dt = dnf_target(ROCKY9, "branch", "580", V580B, 580, "proprietary")
    choice = dnf_plan.choose(dt, KERNEL, STREAMS)
    assert (choice.stream, choice.version, choice.precompiled) == ("580", V580B, True)
    assert choice.kmod == "kmod-nvidia-580.126.20-6.1.0-56"


@pytest.mark.parametrize(
    ("kind", "value", "flavour", "kernel", "stream", "version"),
    [
        ("branch", "580", "proprietary", "6.1.0-99.el9.x86_64", "580-dkms", V580B),  # no kmod
        ("exact", V580A, "proprietary", KERNEL, "580-dkms", V580A),  # not in stream 580
        ("branch", "580", "open", KERNEL, "580-open", V580B),
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
        dnf_plan.choose(dt, KERNEL, STREAMS)
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
    runner = rpm_answer({}).on(
        "dnf", returncode=1, output="No match for argument: epel-release\n"
    )
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
