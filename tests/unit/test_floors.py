"""Driver floors: the shipped data (each fact with its source), what each floor lets through, and
`auto`, a branch, an alias and an exact pin checked against them before anything is fetched."""

from __future__ import annotations

from pathlib import Path

import pytest
from lib.cli import invoke
from lib.dnfplans import decision, plan_for
from lib.fakes import FakeRunner
from lib.hosttrees import B200_595, GB300_595, H100, make_host, root_env

from installer import app
from installer.errors import DriverBelowFloor, NoReleaseMeetsFloors, UnsupportedGpu
from installer.host import PciGpu
from installer.release import catalog, floors, versions
from installer.release.floors import HostShape

RESOLUTE = HostShape("7.0.0-14-generic", "ubuntu", "26.04")
TRIXIE = HostShape("6.12.118+deb13-amd64", "debian", "13")
NOBLE = HostShape("6.8.0-87-generic", "ubuntu", "24.04")


def gpu(device_id: int) -> PciGpu:
    return PciGpu("0000:17:00.0", device_id, 0x030200)


def on(shape: HostShape) -> tuple[floors.Floor, ...]:
    return floors.applicable(floors.shipped(), shape)


def resolve(request: str, shape: HostShape, *gpus: int, **kwargs: object) -> versions.Resolution:
    host = shape._replace(gpu_ids=gpus)
    return versions.resolve(request, catalog.shipped(), [gpu(g) for g in gpus],
                            floors=on(host), **kwargs)  # type: ignore[arg-type]


def test_every_shipped_floor_names_its_source_and_what_it_asks() -> None:
    shipped = floors.shipped()
    assert {f.id for f in shipped} >= {"kernel-7.0", "ubuntu-26.04", "gpu-b200-2909", "gpu-gb10",
                                      "debian-13-pci-resize-resource-open-550"}
    for floor in shipped:
        assert floor.source and floor.why
        assert floor.min_branch or floor.min_release or floor.fails_branches
    # The catalog holds the releases the floors name (the kernel 7.0 fixes).
    for floor in shipped:
        for _, release in floor.min_release:
            assert catalog.shipped().find(release) is not None, release


@pytest.mark.parametrize(("kernel", "numbers"), [
    ("7.0.0-14-generic", (7, 0, 0)), ("6.12.107+deb13-amd64", (6, 12, 107)),
    ("6.17.0-1011-azure", (6, 17, 0)), ("5.14.0-427.el9.x86_64", (5, 14, 0)), ("weird", None)])
def test_the_kernel_version_leads_its_release_name(kernel: str,
                                                   numbers: tuple[int, ...] | None) -> None:
    assert floors.kernel_numbers(kernel) == numbers


def test_which_floors_a_host_meets() -> None:
    assert {f.id for f in on(RESOLUTE)} == {"kernel-7.0", "ubuntu-26.04", "kernel-6.17-r550",
                                            "kernel-6.19-r590"}
    assert {f.id for f in on(TRIXIE)} == {"debian-13-pci-resize-resource-open-550"}
    # Before 6.12.107 the open 550 modules still compile: no floor.
    assert on(TRIXIE._replace(kernel="6.12.43+deb13-amd64")) == ()
    assert on(NOBLE) == ()
    assert [f.id for f in on(NOBLE._replace(gpu_ids=(B200_595,)))] == ["gpu-b200-2909"]


def test_kernel_7_0_lets_through_only_the_fixed_releases() -> None:
    (floor,) = [f for f in floors.shipped() if f.id == "kernel-7.0"]
    assert [v for v in ("580.126.20", "595.71.05", "595.91.07", "610.43.02", "610.57.04",
                        "620.10.01") if floor.allows(v)] == ["595.91.07", "610.57.04",
                                                             "620.10.01"]
    assert floor.asks() == ("R595 or newer (595.91.07 or newer in R595, 610.57.04 or newer "
                            "in R610)")


def test_a_flavour_floor_stops_one_flavour_only() -> None:
    (floor,) = on(TRIXIE)
    assert not floor.allows("550.163.01", "open")
    assert floor.allows("550.163.01", "proprietary")
    assert floor.allows("580.126.20", "open")
    # Either flavour still possible: nothing blocks the version as such.
    assert floors.blocks_every([floor], "550.163.01", ["open", "proprietary"]) == []
    assert floors.blocks_every([floor], "550.163.01", ["open"]) == [floor]


def test_auto_on_ubuntu_26_04_with_kernel_7_0_picks_595_91_07() -> None:
    chosen = resolve("auto", RESOLUTE, H100)
    assert (chosen.version, chosen.branch, chosen.flavour) == ("595.91.07", 595, "open")
    said = "; ".join(chosen.reasons)
    assert "auto: skipped R580 (lts branch): no release of it meets the floor kernel-7.0" in said
    assert "using the newest production branch that does: R595 (production branch)" in said


def test_a_branch_request_takes_its_newest_release_that_meets_the_floors() -> None:
    # 595.71.05 would have been the branch's newest: drop the newer release from the catalog.
    shipped = catalog.shipped()
    older = shipped._replace(branches=tuple(
        b._replace(releases=b.releases[1:]) if b.major == 595 else b for b in shipped.branches))
    assert older.branch(595).newest.version == "595.71.05"  # type: ignore[union-attr]
    with pytest.raises(DriverBelowFloor) as refused:
        versions.resolve("R595", older, [gpu(H100)], floors=on(RESOLUTE))
    assert "kernel-7.0" in refused.value.message
    assert "open-gpu-kernel-modules #1153" in refused.value.message
    chosen = resolve("R595", RESOLUTE, H100)
    assert chosen.version == "595.91.07"


@pytest.mark.parametrize("request_", ["R580", "580", "lts", "580.126.20", "595.71.05"])
def test_an_explicit_request_below_a_floor_is_refused_naming_it(request_: str) -> None:
    with pytest.raises(DriverBelowFloor) as refused:
        resolve(request_, RESOLUTE, H100)
    message = refused.value.message
    assert "is below this host's floor: kernel-7.0: R595 or newer" in message
    assert "(source: NVIDIA/open-gpu-kernel-modules #1153" in message
    assert "ubuntu-26.04" in message and "gpu-driver-container" in message
    assert message.endswith("the newest release in the catalog that meets them: 595.91.07")
    assert refused.value.exit_code == 79 and refused.value.reference == "driver-below-floor"


def test_an_explicit_request_below_a_floor_goes_on_when_allowed() -> None:
    chosen = resolve("R580", RESOLUTE, H100, allow_below_floor=True)
    assert chosen.version == "580.126.20"
    assert "installing anyway (NVIDIA_INSTALLER_ALLOW_BELOW_FLOOR=true)" in "; ".join(
        chosen.reasons)


def test_gpu_floors_name_their_source() -> None:
    with pytest.raises(DriverBelowFloor) as refused:
        resolve("R580", NOBLE, B200_595)
    assert "gpu-b200-2909: R595 or newer: NVIDIA B200 (0x2909)" in refused.value.message
    assert "amazon-eks-ami" in refused.value.message
    # auto passes over the LTS branch for such a GPU (as before floors: gpus.json says so too).
    assert resolve("auto", NOBLE, GB300_595).branch == 595
    # A GPU without a floor is still refused by the GPU list's own rule.
    with pytest.raises(UnsupportedGpu):
        resolve("R470", NOBLE, H100)


def test_debian_13_s_newer_kernels_refuse_550_open_and_keep_550_proprietary() -> None:
    assert resolve("550.163.01", TRIXIE).flavour == "proprietary"
    with pytest.raises(DriverBelowFloor) as refused:
        resolve("550.163.01", TRIXIE, module_type="open")
    assert "debian-13-pci-resize-resource-open-550: not R550 for open kernel modules" in (
        refused.value.message)
    assert "pci_resize_resource()" in refused.value.message
    # 580 defaults to open there, as anywhere.
    assert resolve("580", TRIXIE).flavour == "open"


def test_a_flavour_floor_turns_auto_to_the_other_flavour_where_the_gpus_allow_it() -> None:
    (floor,) = floors.parse({"floors": [{
        "id": "open-580-breaks", "why": "a posed break", "source": "this test",
        "when": {"kernel_from": "6.8", "flavour": "open"}, "fails_branches": [580]}]})
    chosen = versions.resolve("580", catalog.shipped(), [gpu(H100)], floors=(floor,))
    assert chosen.flavour == "proprietary"  # an H100 runs either; 580's default is open
    assert ("kernel modules: proprietary: the floor open-580-breaks (not R580 for open kernel "
            "modules) stops the open ones") in "; ".join(chosen.reasons)
    # A GPU with open modules only (B200) leaves no other flavour: the request is refused.
    with pytest.raises(DriverBelowFloor, match="open-580-breaks"):
        versions.resolve("580", catalog.shipped(), [gpu(0x2901)], floors=(floor,))
    # auto passes over R580 for R595 then (its newest production branch meeting the floor).
    assert versions.resolve("auto", catalog.shipped(), [gpu(0x2901)],
                            floors=(floor,)).version == "595.91.07"


def test_no_release_meeting_the_floors_is_its_own_error() -> None:
    shipped = catalog.shipped()
    old = shipped._replace(branches=tuple(b for b in shipped.branches if b.major <= 580))
    with pytest.raises(NoReleaseMeetsFloors) as refused:
        versions.resolve("auto", old, [gpu(H100)], floors=on(RESOLUTE))
    assert "kernel-7.0" in refused.value.message and refused.value.exit_code == 80


def test_without_floors_the_choice_is_as_before() -> None:
    chosen = resolve("auto", NOBLE, H100)
    assert (chosen.version, chosen.branch) == ("580.126.20", 580)


@pytest.mark.parametrize(("document", "complaint"), [
    ({}, "'floors' list"),
    ({"floors": [{"id": "x", "why": "y", "source": "z", "when": {"kernel_from": "seven"},
                  "min_branch": 595}]}, "not a kernel version"),
    ({"floors": [{"id": "x", "why": "y", "source": "z", "when": {"os": "ubuntu"}}]},
     "asks nothing"),
    ({"floors": [{"id": "x", "why": "y", "source": "z", "when": {"gpu": "2909"},
                  "min_branch": 595}]}, "PCI device id"),
    ({"floors": [{"id": "x", "why": "y", "source": "z", "when": {"os": "ubuntu"},
                  "min_release": {"595": "580.1.2"}}]}, "min_release"),
    ({"floors": [{"id": "x", "why": "y", "when": {"os": "ubuntu"}, "min_branch": 1}]},
     "'source'"),
])
def test_malformed_floor_data_is_named(document: object, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        floors.parse(document)


# --- `installer plan` on a posed host -----------------------------------------------------


def pose_resolute(tmp_path: Path) -> Path:
    make_host(tmp_path, distro="ubuntu-26.04", kernel="7.0.0-14-generic", gpus=[H100])
    return tmp_path


def test_plan_on_ubuntu_26_04_with_r580_stops_with_the_floor_before_any_download(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = pose_resolute(tmp_path)
    code = invoke(monkeypatch, ["plan"], root_env(root, NVIDIA_DRIVER_VERSION="R580"))
    captured = capsys.readouterr()
    assert code == 79, captured.err
    assert captured.err.startswith("error[driver-below-floor]: 'R580' (R580) is below this "
                                   "host's floor: kernel-7.0: R595 or newer")
    assert "\nhint: " in captured.err and captured.out == ""
    # Nothing was written under the host root.
    assert not (root / "usr/local/nvidia").exists() and not (root / "var/cache").exists()


def test_plan_on_ubuntu_26_04_with_auto_picks_595_91_07_and_shows_each_floor(
        tmp_path: Path) -> None:
    # The kernel's gcc is asked for by the compiler decision: this image's answer is posed.
    plan = plan_for(tmp_path, FakeRunner().on("gcc", "-dumpversion", output="15\n"),
                    distro="ubuntu-26.04", kernel="7.0.0-14-generic",
                    NVIDIA_DRIVER_VERSION="auto")
    assert plan.context.target.version == "595.91.07"
    assert plan.context.target.flavour == "open"
    out = "\n".join(app.describe_plan(plan))
    assert "  version: 595.91.07\n" in out
    for floor in on(RESOLUTE):
        assert (f"  floor: {floor.id}\n      because {floor.asks()}: {floor.why} (source: "
                f"{floor.source})") in out
    assert "  floor: debian-13" not in out
    assert "/NVIDIA-Linux-x86_64-595.91.07.run" in decision(plan, "download")[0]
