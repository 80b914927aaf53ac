"""Artifact keys, tags, vermagic and the registry settings (no registry needed here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.config import from_env
from installer.delivery.registry import ArtifactKey, signing_identity
from installer.errors import ConfigError
from installer.sources.prebuilt import vermagic

KEY = ArtifactKey("580.95.05", "6.1.0-26-amd64", "open", "x86_64")


def test_tags_name_the_key_within_the_oci_tag_grammar() -> None:
    assert KEY.tag() == "580.95.05-6.1.0-26-amd64-open-x86_64-unsigned"
    signed = ArtifactKey("580.95.05", "5.14.0-427.el9+rt~1", "proprietary", "aarch64",
                         signing_identity(b"cert"))
    tag = signed.tag()
    assert tag.startswith("580.95.05-5.14.0-427.el9_rt_1-proprietary-aarch64-key-")
    assert len(tag) <= 128 and all(c.isalnum() or c in "_.-" for c in tag)
    long_kernel = ArtifactKey("580.95.05", "6." + "x" * 200, "open", "x86_64")
    assert len(long_kernel.tag()) == 128


def test_signing_identity_tells_keys_apart() -> None:
    assert signing_identity(None) == "unsigned"
    assert signing_identity(b"a") != signing_identity(b"b")
    assert signing_identity(b"a").startswith("sha256:")


def test_vermagic_is_read_from_the_modinfo_strings(tmp_path: Path) -> None:
    module = tmp_path / "nvidia.ko"
    module.write_bytes(b"\x7fELF...\0license=Dual MIT/GPL\0vermagic=6.1.0-26-amd64 SMP "
                       b"preempt mod_unload modversions \0name=nvidia\0")
    assert vermagic(module) == "6.1.0-26-amd64 SMP preempt mod_unload modversions "
    (tmp_path / "plain.ko").write_bytes(b"no modinfo here")
    assert vermagic(tmp_path / "plain.ko") is None


def test_registry_settings_are_validated_and_the_password_is_never_shown() -> None:
    config = from_env({"NVIDIA_MODULE_REGISTRY": "registry.example.com:5000/gpu/nvidia-modules",
                       "NVIDIA_MODULE_REGISTRY_PASSWORD": "t0ken-secret"})
    assert config.module_registry == "registry.example.com:5000/gpu/nvidia-modules"
    assert "t0ken-secret" not in repr(config)
    for bad in ("https://registry.example.com/x", "registry.example.com", "reg.example/Upper",
                "reg.example/x:tag"):
        with pytest.raises(ConfigError):
            from_env({"NVIDIA_MODULE_REGISTRY": bad})
