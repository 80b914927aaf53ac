"""IMEX without processes: when it is installed (NVIDIA_IMEX, GB200/GB300 trays), what the plan
says (the host's nvidia-imex.service, nvidiaDriverRoot, the dnf package by branch), the
redistrib JSON's imex entry, and the IMEX channel device verify reports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from lib.contexts import V
from lib.fakes import FakeRunner
from lib.hosttrees import B200, GB200, H100, make_host, root_env

from installer import planner
from installer.components import imex
from installer.config import from_env
from installer.errors import ConfigError, ImexMismatch, ImexUnavailable
from installer.hostroot import HostRoot

GB300 = 0x31C2


def plan_for(tmp_path: Path, **env: str) -> planner.Plan:
    config = from_env(root_env(tmp_path, NVIDIA_DRIVER_VERSION=V, **env))
    return planner.make_plan(config, FakeRunner(), fetch_bytes=lambda url: b"",
                             fetch_runfile=lambda *a: tmp_path)


def test_imex_is_for_nvl72_trays_unless_asked() -> None:
    auto = from_env({})
    assert imex.wanted(auto, (GB200,))[0] and imex.wanted(auto, (GB300,))[0]
    assert imex.wanted(auto, (0x31C3,))[0]
    assert imex.wanted(auto, (B200, H100)) == (
        False, "no GB200/GB300 GPU (NVIDIA_IMEX=install installs it anyway)")
    assert imex.wanted(from_env({"NVIDIA_IMEX": "install"}), (H100,)) == (
        True, "NVIDIA_IMEX=install")
    assert not imex.wanted(from_env({"NVIDIA_IMEX": "false"}), (GB200,))[0]
    with pytest.raises(ConfigError, match="NVIDIA_IMEX='yes' is not one of"):
        from_env({"NVIDIA_IMEX": "yes"})


def test_a_tray_plan_installs_imex_and_says_to_mask_the_hosts_unit(tmp_path: Path) -> None:
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", gpus=[GB200] * 4)
    unit = tmp_path / "usr/lib/systemd/system/nvidia-imex.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg\n")
    plan = plan_for(tmp_path)
    (said,) = [d for d in plan.decisions if d.topic == "imex"]
    assert said.value == f"nvidia-imex {V}"
    assert said.reason.startswith("GPUs 10de:2941 are GB200/GB300 NVL72 parts")
    assert (f"into versions/{V}/bin (the DRA driver finds them with "
            "nvidiaDriverRoot=/var/lib/nvidia)") in said.reason
    assert said.reason.endswith(
        "the host's /usr/lib/systemd/system/nvidia-imex.service is left alone: mask it "
        "(systemctl mask nvidia-imex) where the DRA driver's compute-domain daemon runs IMEX")
    assert "install-imex" in [s.name for s in plan.steps]
    assert unit.read_text().startswith("[Service]")  # plan changes nothing
    masked = tmp_path / "etc/systemd/system/nvidia-imex.service"
    masked.parent.mkdir(parents=True)
    os.symlink("/dev/null", masked)
    assert imex.host_unit(HostRoot(tmp_path)) == "masked"


def test_elsewhere_imex_is_not_installed(tmp_path: Path) -> None:
    make_host(tmp_path, distro="debian-12", kernel="6.1.0-56-amd64", gpus=[H100])
    plan = plan_for(tmp_path)
    (said,) = [d for d in plan.decisions if d.topic == "imex"]
    assert said.value == "not installed"
    assert "install-imex" not in [s.name for s in plan.steps]


@pytest.mark.parametrize(("branch", "version", "package"), [
    (580, "580.105.08", "nvidia-imex-580.105.08"),
    (570, "570.195.03", "nvidia-imex-570-570.195.03"),
])
def test_the_dnf_source_names_nvidias_imex_package_by_branch(
        tmp_path: Path, branch: int, version: str, package: str) -> None:
    import dataclasses

    from lib.contexts import context

    from installer import sources

    ctx = context(tmp_path, FakeRunner(), NVIDIA_IMEX="install")
    dnf = sources.named("dnf")
    ctx = dataclasses.replace(ctx, target=dataclasses.replace(
        ctx.target, version=version, branch=branch, source="dnf",
        ships_user_space=lambda component: dnf.ships_user_space(component, ctx.facts.distro)))
    said = imex.COMPONENT.decision(ctx)
    assert said.value == "not installed by the installer"
    assert f"install NVIDIA's {package} package of the driver's version" in said.reason
    assert imex.COMPONENT.steps(ctx) == []


def entry(version: str = V, **item: object) -> bytes:
    listed = {"relative_path": f"imex/linux-x86_64/nvidia-imex-linux-x86_64-{version}-archive"
              ".tar.xz", "sha256": "a" * 64, "size": "1234", **item}
    return json.dumps({"imex": {"version": version, "linux-x86_64": listed}}).encode()


def test_the_redistrib_jsons_imex_entry_is_checked() -> None:
    listed = imex.parse_entry(entry(), V, "x86_64", "mirror/redistrib.json")
    assert (listed.size, listed.sha256) == (1234, "a" * 64)
    with pytest.raises(ImexMismatch, match=r"lists imex '570\.195\.03', not"):
        imex.parse_entry(entry("570.195.03"), V, "x86_64", "m")
    with pytest.raises(ImexMismatch, match="not an imex archive"):
        imex.parse_entry(entry(relative_path="../../etc/x.tar.xz"), V, "x86_64", "m")
    with pytest.raises(ImexUnavailable, match="lists no imex archive for linux-sbsa"):
        imex.parse_entry(entry(), V, "aarch64", "m")
    assert ImexMismatch.exit_code == 19 and ImexUnavailable.exit_code == 59


def test_verify_reads_the_imex_channel_device(tmp_path: Path) -> None:
    root = HostRoot(tmp_path)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text("Character devices:\n195 nvidia\n"
                                           "234 nvidia-caps-imex-channels\n")
    assert imex.channel(root) == {"device": "nvidia-caps-imex-channels", "major": 234,
                                  "channel0": "/dev/nvidia-caps-imex-channels/channel0",
                                  "channel0_present": False}
    (tmp_path / "dev/nvidia-caps-imex-channels").mkdir(parents=True)
    (tmp_path / "dev/nvidia-caps-imex-channels/channel0").touch()
    assert imex.channel(root)["channel0_present"] is True


def test_verify_json_shows_the_imex_channel_where_imex_is(tmp_path: Path) -> None:
    from installer import components
    from installer.verify.report import VerifyReport

    root = make_host(tmp_path, gpus=[GB200])
    config = from_env(root_env(tmp_path))
    (tmp_path / "proc/devices").write_text("Character devices:\n511 nvidia-caps-imex-channels\n")
    sections = components.verify_sections(config, root)
    assert sections == {"imex": {"device": "nvidia-caps-imex-channels", "major": 511,
                                 "channel0": "/dev/nvidia-caps-imex-channels/channel0",
                                 "channel0_present": False}}
    report = VerifyReport(V, (), V, V, (), (), sections=sections)
    document = report.to_json()
    assert document["imex"]["major"] == 511 and list(document)[-1] == "problems"
    assert components.verify_sections(config, make_host(tmp_path / "h100", gpus=[H100])) == {}
