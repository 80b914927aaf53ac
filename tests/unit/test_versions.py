"""installer.release.versions: request parsing and GPU-aware resolution against the shipped data."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from lib.hosttrees import (
    A10,
    A30,
    A100,
    B200,
    B200_595,
    B300,
    GB200,
    GB300,
    GB300_595,
    GH200,
    GH200_144G,
    H100,
    H200,
    K80,
    L4,
    L40S,
    M60,
    P4,
    P100,
    T4,
    V100,
    pci_gpus,
)

from installer.errors import (
    ConfigError,
    IncompatibleGpus,
    InstallerError,
    InvalidVersion,
    UnknownVersion,
    UnsupportedGpu,
)
from installer.release import catalog, versions
from installer.release.gpus import GpuDatabase, parse_database, shipped_database
from installer.release.versions import (
    Resolution,
    VersionRequest,
    parse_request,
    resolve,
    runfile_url,
)

SHIPPED = catalog.shipped()
NEWEST = {b.major: b.newest.version for b in SHIPPED.branches}
UNKNOWN_NEW = 0x3F10  # not in the shipped list, above Turing's id range
UNKNOWN_OLD = 0x1C82  # a GeForce GTX 1050 Ti (Pascal): not in the shipped list


def run(request: str, *device_ids: int, **kwargs: Any) -> Resolution:
    return resolve(request, SHIPPED, pci_gpus(*device_ids), **kwargs)


# --- parsing -----------------------------------------------------------------------------


# Each kind of request: the texts that parse to it, each with the value it names.
PARSED = {
    "exact": {"550.54.15": "550.54.15", "470.82": "470.82", " 580.82.07\n": "580.82.07"},
    "branch": {"550": "550", "R550": "550", "r550": "550"},
    "alias": {"auto": "auto", "default": "auto", "latest": "latest", "LATEST": "latest",
              "production": "production", "lts": "lts"},
}


@pytest.mark.parametrize(("text", "kind", "value"), [
    pytest.param(text, kind, value, id=f"{kind}-{text.strip()}")
    for kind, texts in PARSED.items() for text, value in texts.items()])
def test_parse_request(text: str, kind: str, value: str) -> None:
    assert parse_request(text) == VersionRequest(kind, value, text)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "550; rm -rf /",
        "../../x",
        "newest",
        "5500.1.1",
        "",
        "   ",
        "R5500",
        "RR550",
        "550.54.15.1",
        "550.54.15 --silent",
        "$(reboot)",
        "550.54.15\n470.82",
        "055",
        "v550",
        "550.x",
        "5\u0665\u0660.\u0665\u0664.\u0661\u0665",  # Arabic-Indic digits: int() takes them
        "\uff15\uff15\uff10",  # fullwidth 550
        "R\u0665\u0665\u0660",
    ],
)
def test_bad_requests(text: str) -> None:
    with pytest.raises(InvalidVersion) as err:
        parse_request(text)
    assert repr(text) in err.value.message
    assert err.value.reference == "invalid-version"


def test_resolve_rejects_bad_requests_too() -> None:
    with pytest.raises(InvalidVersion):
        run("550; rm -rf /", H100)


# --- pins and branches -------------------------------------------------------------------

TABLE = [
    # request, gpus, kwargs, version, branch, flavour
    ("550.54.15", (), {}, "550.54.15", 550, "proprietary"),
    ("550.54.15", (H100,), {}, "550.54.15", 550, "proprietary"),
    ("580.82.07", (T4,), {}, "580.82.07", 580, "open"),
    ("580.82.07", (T4,), {"module_type": "proprietary"}, "580.82.07", 580, "proprietary"),
    ("550.54.15", (A100,), {"module_type": "open"}, "550.54.15", 550, "open"),
    ("470.256.02", (K80,), {}, "470.256.02", 470, "proprietary"),
    ("550", (), {}, NEWEST[550], 550, "proprietary"),
    ("R550", (L4,), {}, NEWEST[550], 550, "proprietary"),
    ("r535", (H100,), {}, NEWEST[535], 535, "proprietary"),
    ("R470", (K80, K80), {}, NEWEST[470], 470, "proprietary"),
    ("R570", (B200,), {}, NEWEST[570], 570, "open"),
    ("575", (GB200,), {}, NEWEST[575], 575, "open"),
    ("latest", (), {}, NEWEST[610], 610, "open"),
    ("latest", (H100,), {}, NEWEST[610], 610, "open"),
    ("production", (), {}, NEWEST[595], 595, "open"),
    ("lts", (A100,), {}, NEWEST[580], 580, "open"),
    ("LTS", (V100,), {}, NEWEST[580], 580, "proprietary"),
    # auto
    ("auto", (), {}, NEWEST[580], 580, "open"),
    ("auto", (), {"track": "production"}, NEWEST[595], 595, "open"),
    ("auto", (K80,), {}, NEWEST[470], 470, "proprietary"),
    ("auto", (K80,), {"track": "production"}, NEWEST[470], 470, "proprietary"),
    ("auto", (M60,), {}, NEWEST[580], 580, "proprietary"),
    ("auto", (P100, P4), {}, NEWEST[580], 580, "proprietary"),
    ("auto", (V100,), {}, NEWEST[580], 580, "proprietary"),
    ("auto", (V100,), {"track": "production"}, NEWEST[580], 580, "proprietary"),
    ("auto", (T4,), {}, NEWEST[580], 580, "open"),
    ("auto", (T4,), {"module_type": "proprietary"}, NEWEST[580], 580, "proprietary"),
    ("auto", (A100,), {}, NEWEST[580], 580, "open"),
    ("auto", (A100,), {"track": "production"}, NEWEST[595], 595, "open"),
    ("auto", (A10, A30), {}, NEWEST[580], 580, "open"),
    ("auto", (H100,) * 8, {}, NEWEST[580], 580, "open"),
    ("auto", (H200,), {}, NEWEST[580], 580, "open"),
    ("auto", (L4,), {}, NEWEST[580], 580, "open"),
    ("auto", (L40S,), {}, NEWEST[580], 580, "open"),
    ("auto", (B200,) * 8, {}, NEWEST[580], 580, "open"),
    ("auto", (GB200,), {"track": "production"}, NEWEST[595], 595, "open"),
    ("auto", (UNKNOWN_NEW,), {}, NEWEST[580], 580, "open"),
    ("auto", (UNKNOWN_OLD,), {}, NEWEST[580], 580, "proprietary"),
    ("auto", (UNKNOWN_OLD,), {"track": "production"}, NEWEST[580], 580, "proprietary"),
    ("auto", (V100, H100), {}, NEWEST[580], 580, "proprietary"),
    ("auto", (V100, H100), {"track": "production"}, NEWEST[580], 580, "proprietary"),
    ("default", (L4,), {}, NEWEST[580], 580, "open"),
    ("auto", (H100,), {"module_type": "proprietary"}, NEWEST[580], 580, "proprietary"),
]


@pytest.mark.parametrize(
    ("request_", "device_ids", "kwargs", "version", "branch", "flavour"),
    TABLE,
    ids=[f"{r}-{'+'.join(hex(d) for d in g) or 'nogpu'}-{k}" for r, g, k, *_ in TABLE],
)
def test_resolution_table(
    request_: str,
    device_ids: Sequence[int],
    kwargs: dict[str, str],
    version: str,
    branch: int,
    flavour: str,
) -> None:
    result = run(request_, *device_ids, **kwargs)
    assert (result.version, result.branch, result.flavour) == (version, branch, flavour)
    assert result.branch_type == SHIPPED.branch(branch).type  # type: ignore[union-attr]
    assert result.in_catalog
    assert result.reasons, "every decision carries a reason"
    assert any("kernel modules" in reason for reason in result.reasons)


def test_expected_newest_versions_of_shipped_data() -> None:
    # Guards the table above against silently meaningless expectations.
    assert NEWEST[580].startswith("580.") and NEWEST[470] == "470.256.02"
    assert SHIPPED.branch(580).type == catalog.LTS  # type: ignore[union-attr]


def test_pin_not_in_catalog_is_allowed_but_flagged() -> None:
    result = run("580.999.01", H100)
    assert (result.version, result.branch, result.flavour) == ("580.999.01", 580, "open")
    assert result.branch_type == catalog.LTS
    assert not result.in_catalog
    assert any("not in the catalog" in r for r in result.reasons)


def test_pin_of_a_branch_the_catalog_lacks() -> None:
    result = run("620.10.01")
    assert result.branch_type is None and not result.in_catalog
    assert result.flavour == "open"


def test_two_part_pin() -> None:
    result = run("470.82", K80)
    assert (result.version, result.branch, result.flavour) == ("470.82", 470, "proprietary")
    assert not result.in_catalog


def test_pinned_550_with_k80_names_the_legacy_branch() -> None:
    with pytest.raises(UnsupportedGpu) as err:
        run("550.54.15", K80)
    assert "K80" in err.value.message
    assert "470" in err.value.message
    assert "0000:10:00.0" in err.value.message


@pytest.mark.parametrize(
    ("request_", "device_id", "needle"),
    [
        ("470.256.02", H100, "525 or newer"),
        ("R525", B200, "570 or newer"),
        ("R535", H200, "550 or newer"),
        ("R595", V100, "580 or older"),
        ("latest", V100, "V100"),
        ("latest", K80, "470"),
        ("lts", K80, "K80"),
        ("production", P100, "P100"),
    ],
)
def test_explicit_choices_that_cannot_drive_the_gpu(
    request_: str, device_id: int, needle: str
) -> None:
    with pytest.raises(UnsupportedGpu) as err:
        run(request_, device_id)
    assert needle in err.value.message


def test_branch_not_in_catalog() -> None:
    with pytest.raises(UnknownVersion) as err:
        run("R999")
    assert "R999" in err.value.message
    assert "R580" in err.value.message  # lists what the catalog has


# --- mixed GPUs and flavours -------------------------------------------------------------


def test_k80_with_h100_is_incompatible() -> None:
    with pytest.raises(IncompatibleGpus) as err:
        run("auto", K80, H100)
    assert "K80" in err.value.message and "H100" in err.value.message


def test_v100_with_b200_needs_different_flavours() -> None:
    with pytest.raises(IncompatibleGpus) as err:
        run("auto", V100, B200)
    assert "V100" in err.value.message and "B200" in err.value.message
    assert "open" in err.value.message


def test_incompatible_flavours_even_when_pinned() -> None:
    with pytest.raises(IncompatibleGpus):
        run("580.82.07", P4, GB200)


def test_open_forced_on_v100() -> None:
    with pytest.raises(UnsupportedGpu) as err:
        run("auto", V100, module_type="open")
    assert "V100" in err.value.message
    assert "proprietary" in err.value.message


def test_open_forced_names_only_the_blocking_gpus() -> None:
    with pytest.raises(UnsupportedGpu) as err:
        run("auto", V100, H100, module_type="open")
    assert "V100" in err.value.message and "H100" not in err.value.message


def test_proprietary_forced_on_blackwell() -> None:
    with pytest.raises(UnsupportedGpu) as err:
        run("auto", B200, module_type="proprietary")
    assert "B200" in err.value.message


def test_open_on_a_branch_without_open_modules() -> None:
    with pytest.raises(ConfigError) as err:
        run("R470", module_type="open")
    assert "R515" in err.value.message


def test_open_forced_on_k80_is_a_gpu_error() -> None:
    with pytest.raises(UnsupportedGpu):
        run("auto", K80, module_type="open")


def test_unknown_new_gpu_on_a_pre_open_branch() -> None:
    with pytest.raises(UnsupportedGpu) as err:
        run("470.256.02", UNKNOWN_NEW)
    assert "open kernel modules" in err.value.message


def test_open_default_starts_at_r560() -> None:
    assert run("R550", A100).flavour == "proprietary"
    assert run("R560", A100).flavour == "open"
    assert run("R515", A100).flavour == "proprietary"
    assert run("R515", A100, module_type="open").flavour == "open"


@pytest.mark.parametrize(("module_type", "track"), [("kernel", "lts"), ("auto", "newest")])
def test_bad_settings(module_type: str, track: str) -> None:
    with pytest.raises(ConfigError):
        run("auto", module_type=module_type, track=track)


# --- reasons -----------------------------------------------------------------------------


def test_no_gpu_reason() -> None:
    result = run("auto")
    assert any("no NVIDIA GPU" in r for r in result.reasons)


def test_reasons_explain_the_auto_choice() -> None:
    result = run("auto", V100, V100, track="production")
    text = "\n".join(result.reasons)
    assert "found 2 NVIDIA GPU(s): 2 x Tesla V100-SXM2-16GB (10de:1db1)" in text
    assert "skipped R595 (production branch)" in text
    assert "R580 (lts branch) is the newest production or LTS branch" in text
    assert "proprietary" in text


def test_reason_for_legacy_routing() -> None:
    text = "\n".join(run("auto", K80).reasons)
    assert "legacy branch" in text and "R470" in text


def test_reason_for_unknown_gpus() -> None:
    assert any("newer than it" in r for r in run("auto", UNKNOWN_NEW).reasons)
    assert any("pre-Turing" in r for r in run("auto", UNKNOWN_OLD).reasons)


# --- small catalogs ----------------------------------------------------------------------


def small_catalog(branches: dict[int, tuple[str, list[str]]]) -> catalog.Catalog:
    document = {
        str(major): {
            "type": kind,
            "driver_info": [{"release_version": v, "runfile_url": {}} for v in releases],
        }
        for major, (kind, releases) in branches.items()
    }
    return catalog.parse(json.dumps(document), "test catalog")


def test_auto_falls_back_outside_the_track_when_nothing_in_it_fits() -> None:
    small = small_catalog(
        {535: ("lts branch", ["535.230.02"]), 570: ("production branch", ["570.124.06"])}
    )
    result = resolve("auto", small, pci_gpus(B200))
    assert (result.version, result.flavour) == ("570.124.06", "open")
    assert any("no LTS branch in the catalog supports" in r for r in result.reasons)


@pytest.mark.parametrize(("branches", "gpu", "error", "named"), [
    pytest.param({535: ("lts branch", ["535.230.02"])}, B200, UnsupportedGpu, "test catalog",
                 id="no-branch-for-the-gpu"),
    pytest.param({580: ("lts branch", ["580.82.07"])}, K80, UnknownVersion, "470",
                 id="its-legacy-branch-missing-from-the-catalog"),
])
def test_auto_refuses_a_catalog_without_the_gpus_branch(
        branches: dict[int, tuple[str, list[str]]], gpu: int, error: type[InstallerError],
        named: str) -> None:
    with pytest.raises(error) as err:
        resolve("auto", small_catalog(branches), pci_gpus(gpu))
    assert named in err.value.message


def test_auto_when_no_single_branch_fits_all() -> None:
    small = small_catalog(
        {550: ("production branch", ["550.54.15"]), 470: ("lts branch", ["470.256.02"])}
    )
    database = GpuDatabase(
        shipped_database().models
        + parse_database(
            {
                "architectures": {"old": {"lastbranch": 470}},
                "chips": [{"devid": "0x0FFF", "name": "Old Card", "architecture": "old"}],
            }
        ).models
    )
    with pytest.raises(IncompatibleGpus) as err:
        resolve("auto", small, pci_gpus(0x0FFF, H100), database=database)
    assert "Old Card" in err.value.message and "H100" in err.value.message


def test_alias_without_branch_of_that_type() -> None:
    small = small_catalog({575: ("new feature branch", ["575.57.08"])})
    with pytest.raises(UnknownVersion):
        resolve("lts", small, [])
    assert resolve("latest", small, []).version == "575.57.08"
    assert resolve("auto", small, []).version == "575.57.08"


def test_request_object_is_accepted() -> None:
    assert resolve(parse_request("R550"), SHIPPED, []).branch == 550


# --- the GPU data ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_id", "name", "minimum", "last", "flavours"),
    [
        (K80, "K80", 0, 470, {"proprietary"}),
        (M60, "M60", 0, 580, {"proprietary"}),
        (P100, "P100", 0, 580, {"proprietary"}),
        (P4, "P4", 0, 580, {"proprietary"}),
        (0x1DB1, "V100", 0, 580, {"proprietary"}),
        (0x1DB4, "V100", 0, 580, {"proprietary"}),
        (0x1DB5, "V100", 0, 580, {"proprietary"}),
        (0x1DB6, "V100", 0, 580, {"proprietary"}),
        (T4, "T4", 410, None, {"open", "proprietary"}),
        (A10, "A10", 460, None, {"open", "proprietary"}),
        (0x20B0, "A100", 450, None, {"open", "proprietary"}),
        (0x20B2, "A100", 450, None, {"open", "proprietary"}),
        (0x20B5, "A100", 450, None, {"open", "proprietary"}),
        (0x20F1, "A100", 450, None, {"open", "proprietary"}),
        (A30, "A30", 460, None, {"open", "proprietary"}),
        (0x2330, "H100", 525, None, {"open", "proprietary"}),
        (0x2331, "H100", 525, None, {"open", "proprietary"}),
        (0x2339, "H100", 525, None, {"open", "proprietary"}),
        (H200, "H200", 550, None, {"open", "proprietary"}),
        (L4, "L4", 525, None, {"open", "proprietary"}),
        (L40S, "L40S", 525, None, {"open", "proprietary"}),
        (B200, "B200", 570, None, {"open"}),
        (GB200, "GB200", 570, None, {"open"}),
    ],
)
def test_shipped_gpu_data(
    device_id: int, name: str, minimum: int, last: int | None, flavours: set[str]
) -> None:
    model = shipped_database().lookup(device_id)
    assert model is not None
    assert name in model.name
    assert (model.min_branch, model.last_branch) == (minimum, last)
    assert set(model.flavours) == flavours


def test_k80_is_marked_legacy() -> None:
    model = shipped_database().lookup(K80)
    assert model is not None and model.legacy_branch == "470.xx"
    assert model.supports_branch(460) and model.supports_branch(470)
    assert not model.supports_branch(535)


# --- runfile URLs ------------------------------------------------------------------------


def test_runfile_url_default_layout() -> None:
    assert runfile_url("550.54.15", "x86_64") == (
        "https://us.download.nvidia.com/tesla/550.54.15/NVIDIA-Linux-x86_64-550.54.15.run"
    )
    assert runfile_url("470.82", "aarch64", "XFree86/Linux-aarch64", "https://m.example/") == (
        "https://m.example/XFree86/Linux-aarch64/470.82/NVIDIA-Linux-aarch64-470.82.run"
    )


def test_runfile_url_prefers_the_catalog_for_the_default_location() -> None:
    document = {
        "550": {
            "type": "production branch",
            "driver_info": [
                {
                    "release_version": "550.54.15",
                    "runfile_url": {"x86_64": "https://cdn.example/x.run"},
                }
            ],
        }
    }
    small = catalog.parse(json.dumps(document), "t")
    assert runfile_url("550.54.15", "x86_64", catalog=small) == "https://cdn.example/x.run"
    # No aarch64 entry: the default layout.
    assert runfile_url("550.54.15", "aarch64", catalog=small).startswith(
        "https://us.download.nvidia.com/tesla/550.54.15/"
    )
    # A mirror or another branch path is the user's choice: the catalog does not override it.
    assert runfile_url("550.54.15", "x86_64", base="https://m.example", catalog=small) == (
        "https://m.example/tesla/550.54.15/NVIDIA-Linux-x86_64-550.54.15.run"
    )
    shipped_url = runfile_url("580.82.07", "x86_64", catalog=SHIPPED)
    assert shipped_url.endswith("/tesla/580.82.07/NVIDIA-Linux-x86_64-580.82.07.run")


@pytest.mark.parametrize(
    ("version", "arch", "branch_path", "base", "error"),
    [
        ("550.54.15; rm", "x86_64", "tesla", versions.DEFAULT_BASE, InvalidVersion),
        ("550.54.15", "ppc64le", "tesla", versions.DEFAULT_BASE, ConfigError),
        ("550.54.15", "x86_64", "../etc", versions.DEFAULT_BASE, ConfigError),
        ("550.54.15", "x86_64", "tesla/../x", versions.DEFAULT_BASE, ConfigError),
        ("550.54.15", "x86_64", "tesla", "ftp://x", ConfigError),
    ],
)
def test_runfile_url_rejects_unsafe_values(
    version: str, arch: str, branch_path: str, base: str, error: type[Exception]
) -> None:
    with pytest.raises(error):
        runfile_url(version, arch, branch_path, base)


# --- Blackwell and Grace: the open flavour whatever is asked (a proprietary request refused
# before anything is downloaded, naming the GPU) ----------------------------------------------


@pytest.mark.parametrize("device_id, request_", [
    (GH200, "R550"), (GH200_144G, "R570"), (B200_595, "R595"), (B300, "R580"),
    (GB300, "R580"), (GB300_595, "R595"), (GB200, "R570")])
def test_blackwell_and_grace_get_the_open_flavour_under_auto(device_id: int,
                                                              request_: str) -> None:
    # Before R560 NVIDIA's default is proprietary: these GPUs still get the open modules.
    assert resolve(request_, SHIPPED, pci_gpus(device_id)).flavour == "open"


@pytest.mark.parametrize("device_id, name", [
    (GH200, "NVIDIA GH200 480GB"), (GH200_144G, "NVIDIA GH200 144G HBM3e"),
    (B300, "NVIDIA B300 SXM6 AC"), (GB300, "NVIDIA GB300"), (GB200, "NVIDIA GB200")])
def test_a_proprietary_request_is_refused_naming_the_gpu(device_id: int, name: str) -> None:
    with pytest.raises(UnsupportedGpu) as raised:
        resolve("R580", SHIPPED, pci_gpus(device_id), module_type="proprietary")
    assert name in raised.value.message and "0000:10:00.0" in raised.value.message
    assert "support only the open ones" in raised.value.message


def test_an_h100_may_still_run_proprietary() -> None:
    assert resolve("R580", SHIPPED, pci_gpus(H100), module_type="proprietary").flavour == \
        "proprietary"
