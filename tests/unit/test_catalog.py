"""installer.release.catalog: the shipped releases.json, other sources, malformed input."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from installer.errors import CatalogUnavailable, DownloadFailed
from installer.release import catalog
from installer.release.catalog import LTS, NEW_FEATURE, PRODUCTION, Catalog

# NVIDIA's data-center support table (reference/versions-and-sources.md).
BRANCH_TYPES = {
    450: LTS,
    460: PRODUCTION,
    465: NEW_FEATURE,
    470: LTS,
    495: NEW_FEATURE,
    510: PRODUCTION,
    515: PRODUCTION,
    520: NEW_FEATURE,
    525: PRODUCTION,
    535: LTS,
    550: PRODUCTION,
    560: NEW_FEATURE,
    565: NEW_FEATURE,
    570: PRODUCTION,
    575: NEW_FEATURE,
    580: LTS,
    595: PRODUCTION,
    610: NEW_FEATURE,
}


def no_fetch(url: str) -> bytes:
    raise AssertionError(f"unexpected fetch of {url}")


def small_document() -> dict[str, Any]:
    def info(version: str) -> dict[str, Any]:
        return {
            "release_version": version,
            "release_date": "2024-01-01",
            "release_notes": "https://example.invalid/notes",
            "architectures": ["x86_64", "aarch64", "ppc64le"],
            "runfile_url": {
                "x86_64": f"https://mirror.example/{version}/NVIDIA-Linux-x86_64-{version}.run",
                "aarch64": "",
            },
        }

    return {
        "550": {"type": "production branch", "driver_info": [info("550.54.15")]},
        "535": {
            "type": "lts branch",
            "driver_info": [info("535.104.05"), info("535.161.07"), info("535.54.03")],
        },
    }


def test_shipped_catalog_shape_matches_nvidia_releases_json() -> None:
    raw = json.loads(
        resources.files("installer.release").joinpath("data/releases.json").read_text(encoding="utf-8")
    )
    assert set(raw) == {str(b) for b in BRANCH_TYPES} | {"590"}
    for key, branch in raw.items():
        assert set(branch) == {"type", "driver_info"}
        assert branch["type"] in {PRODUCTION, LTS, NEW_FEATURE}
        versions = [info["release_version"] for info in branch["driver_info"]]
        assert versions == sorted(versions, key=catalog.version_key, reverse=True), key
        for info in branch["driver_info"]:
            assert set(info) == {
                "release_version",
                "release_date",
                "release_notes",
                "architectures",
                "runfile_url",
            }
            version = info["release_version"]
            assert version.startswith(key + ".")
            for arch in ("x86_64", "aarch64"):
                assert info["runfile_url"][arch] == (
                    f"https://us.download.nvidia.com/tesla/{version}/"
                    f"NVIDIA-Linux-{arch}-{version}.run"
                )


@pytest.mark.parametrize(("major", "kind"), sorted(BRANCH_TYPES.items()))
def test_shipped_branch_types_follow_nvidia_table(major: int, kind: str) -> None:
    branch = catalog.shipped().branch(major)
    assert branch is not None
    assert branch.type == kind


def test_shipped_has_known_real_releases() -> None:
    shipped = catalog.shipped()
    for version in ("470.256.02", "535.54.03", "550.54.15", "570.86.15", "580.65.06"):
        assert shipped.find(version) is not None, version
    assert shipped.branches[0].major == 610
    assert [b.major for b in shipped.branches] == sorted(
        (b.major for b in shipped.branches), reverse=True
    )


def test_load_none_is_the_shipped_catalog_and_cached() -> None:
    first = catalog.load(None, no_fetch)
    second = catalog.load(None, no_fetch)
    assert second is first  # the same object: parsed once
    assert first.source == catalog.SHIPPED


def test_load_from_path(tmp_path: Path) -> None:
    path = tmp_path / "releases.json"
    path.write_text(json.dumps(small_document()))
    loaded = catalog.load(str(path), no_fetch)
    assert loaded.source == str(path)
    assert [b.major for b in loaded.branches] == [550, 535]
    lts = loaded.branch(535)
    assert lts is not None and lts.is_lts and lts.is_production
    # Out-of-order input is sorted newest first.
    assert [r.version for r in lts.releases] == ["535.161.07", "535.104.05", "535.54.03"]
    assert lts.newest.version == "535.161.07"
    hit = loaded.find("550.54.15")
    assert hit is not None
    release = hit[1]
    assert release.runfile_url("x86_64") == (
        "https://mirror.example/550.54.15/NVIDIA-Linux-x86_64-550.54.15.run"
    )
    assert release.runfile_url("aarch64") is None  # empty strings are no URL
    assert release.architectures == ("x86_64", "aarch64", "ppc64le")
    assert loaded.find("550.1.1") is None
    assert loaded.find("bogus") is None
    assert loaded.newest_release()[1].version == "550.54.15"


@pytest.mark.parametrize("url", ["https://mirror.example/releases.json", "file:///srv/r.json"])
def test_load_from_url_uses_the_injected_fetch(url: str) -> None:
    calls: list[str] = []

    def fetch(requested: str) -> bytes:
        calls.append(requested)
        return json.dumps(small_document()).encode()

    loaded = catalog.load(url, fetch)
    assert calls == [url]
    assert loaded.source == url
    assert loaded.branch(550) is not None


@pytest.mark.parametrize(
    "error", [DownloadFailed("HTTP 503 from mirror.example"), OSError("connection refused")]
)
def test_unreachable_url(error: Exception) -> None:
    def fetch(url: str) -> bytes:
        raise error

    with pytest.raises(CatalogUnavailable) as err:
        catalog.load("https://user:secret@mirror.example/releases.json", fetch)
    message = err.value.message
    assert "mirror.example/releases.json" in message
    assert "secret" not in message
    assert str(error) in message
    assert err.value.reference == "catalog-unavailable"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CatalogUnavailable) as err:
        catalog.load(str(tmp_path / "nope.json"), no_fetch)
    assert str(tmp_path / "nope.json") in err.value.message


def test_unsupported_scheme() -> None:
    with pytest.raises(CatalogUnavailable) as err:
        catalog.load("ftp://mirror.example/releases.json", no_fetch)
    assert "ftp://mirror.example/releases.json" in err.value.message


def _broken(mutate: Any) -> dict[str, Any]:
    document = small_document()
    mutate(document)
    return document


MALFORMED = {
    "not json": b"{not json",
    "a list": b"[]",
    "empty": b"{}",
    "bad key": json.dumps({"R550": small_document()["550"]}).encode(),
    "no type": json.dumps(_broken(lambda d: d["550"].pop("type"))).encode(),
    "no releases": json.dumps(_broken(lambda d: d["550"].update(driver_info=[]))).encode(),
    "bad version": json.dumps(
        _broken(lambda d: d["550"]["driver_info"][0].update(release_version="550.54.15; rm -rf /"))
    ).encode(),
    "wrong branch": json.dumps(
        _broken(lambda d: d["550"]["driver_info"][0].update(release_version="535.1.1"))
    ).encode(),
    "runfile_url not an object": json.dumps(
        _broken(lambda d: d["550"]["driver_info"][0].update(runfile_url="x"))
    ).encode(),
    "binary": b"\xff\xfe\x00",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_catalogs(tmp_path: Path, name: str) -> None:
    path = tmp_path / "releases.json"
    path.write_bytes(MALFORMED[name])
    with pytest.raises(CatalogUnavailable) as err:
        catalog.load(str(path), no_fetch)
    assert str(path) in err.value.message


def test_malformed_names_the_problem() -> None:
    with pytest.raises(CatalogUnavailable) as err:
        catalog.parse(MALFORMED["bad version"], "mirror")
    assert "branch 550, driver_info[0]" in err.value.message
    assert "550.54.15; rm -rf /" in err.value.message


def test_unknown_branch_type_is_kept_but_never_lts() -> None:
    document = small_document()
    document["550"]["type"] = "Experimental Branch"
    loaded = catalog.parse(json.dumps(document), "x")
    branch = loaded.branch(550)
    assert branch is not None and branch.type == "experimental branch"
    assert loaded.of_types(LTS) == (loaded.branch(535),)


def test_redact() -> None:
    assert catalog.redact("https://u:p@h.example:8443/x?q=1") == "https://***@h.example:8443/x?q=1"
    assert catalog.redact("https://h.example/x") == "https://h.example/x"


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("550.54.15", True),
        ("470.82", True),
        ("595.84", True),
        ("460.106.00", True),
        ("5500.1.1", False),
        ("55.1.1", False),
        ("550", False),
        ("550.54.15.1", False),
        ("550.54.x", False),
        ("050.1.1", False),
        (" 550.54.15", False),
        ("550.54.15\n", False),
    ],
)
def test_version_syntax(version: str, ok: bool) -> None:
    assert catalog.is_version(version) is ok


def test_version_key_orders_numerically() -> None:
    assert catalog.version_key("550.127.05") > catalog.version_key("550.54.15")
    assert catalog.version_major("470.82") == 470


def test_catalog_is_a_value() -> None:
    loaded = catalog.parse(json.dumps(small_document()), "x")
    assert loaded == catalog.parse(json.dumps(small_document()), "x")
    assert isinstance(loaded, Catalog)
    with pytest.raises(AttributeError):
        loaded.source = "y"  # type: ignore[misc]


def test_deeply_nested_catalog_is_catalog_unavailable_not_a_traceback() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(CatalogUnavailable) as err:
        catalog.parse(deep, "http://127.0.0.1/releases.json")
    assert err.value.reference == "catalog-unavailable"
    assert "nested too deeply" in err.value.message


def test_versions_in_a_catalog_are_ascii_digits_only() -> None:
    assert not catalog.is_version("5\u0665\u0660.\u0665\u0664.\u0661\u0665")
    assert catalog.is_version("550.54.15")
