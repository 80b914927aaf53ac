"""Artifact keys, tags, vermagic and the registry settings (no registry needed here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.config import from_env
from installer.delivery.registry import ArtifactKey, signing_identity
from installer.errors import ConfigError
from installer.sources.prebuilt.key import vermagic

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


# --- the settings of fleet trust: who may publish modules, whose signatures a node accepts ---


def test_asking_to_push_without_a_registry_or_a_publisher_key_is_an_error() -> None:
    with pytest.raises(ConfigError, match="there is nowhere to publish"):
        from_env({"NVIDIA_MODULE_REGISTRY_PUSH": "true"})  # not a silent no-op
    with pytest.raises(ConfigError, match="needs NVIDIA_MODULE_PUBLISHER_KEY"):
        from_env({"NVIDIA_MODULE_REGISTRY_PUSH": "true",
                  "NVIDIA_MODULE_REGISTRY": "registry.example.com/gpu/m"})
    with pytest.raises(ConfigError, match="needs NVIDIA_MODULE_REGISTRY and "
                       "NVIDIA_MODULE_TRUSTED_KEYS"):
        from_env({"NVIDIA_MODULE_REQUIRE_PREBUILT": "true",
                  "NVIDIA_MODULE_REGISTRY": "registry.example.com/gpu/m"})
    with pytest.raises(ConfigError, match="both set"):
        from_env({"NVIDIA_MODULE_REGISTRY_PASSWORD": "x",
                  "NVIDIA_MODULE_REGISTRY_PASSWORD_FILE": "/run/secrets/password"})


def test_pins_and_token_realms_are_validated() -> None:
    pin = "sha256:" + "Ab" * 32
    config = from_env({"NVIDIA_MODULE_DIGESTS": f" {pin} ,",
                       "NVIDIA_MODULE_REGISTRY_TOKEN_REALMS": "https://auth.docker.io/"})
    assert config.module_digests == (pin.lower(),)
    assert config.module_registry_token_realms == ("https://auth.docker.io",)
    for bad in ("sha256:abc", "md5:" + "0" * 32):
        with pytest.raises(ConfigError, match="is not a sha256"):
            from_env({"NVIDIA_MODULE_DIGESTS": bad})
    for bad in ("http://auth.example.com", "https://auth.example.com/token"):
        with pytest.raises(ConfigError, match="is not https://host"):
            from_env({"NVIDIA_MODULE_REGISTRY_TOKEN_REALMS": bad})


def test_registry_credentials_have_no_flag_and_are_kept_from_children() -> None:
    from click.testing import CliRunner

    from installer.cli import cli
    from installer.config import secret_env_vars
    from installer.runner import child_environment

    help_text = CliRunner().invoke(cli, ["run", "--help"]).output
    assert "--module-registry-password " not in help_text and "--module-registry-password\n" \
        not in help_text
    assert "--module-registry-password-file" in help_text
    assert secret_env_vars() == {"NVIDIA_MODULE_REGISTRY_USERNAME",
                                 "NVIDIA_MODULE_REGISTRY_PASSWORD"}
    env = {"PATH": "/usr/bin", "NVIDIA_MODULE_REGISTRY_PASSWORD": "s3cr3t",
           "NVIDIA_MODULE_REGISTRY_USERNAME": "robot", "ORAS_PASS": "x",
           "NVIDIA_MODULE_REGISTRY": "registry.example.com/gpu/m"}
    assert child_environment(env) == {"PATH": "/usr/bin",
                                      "NVIDIA_MODULE_REGISTRY": "registry.example.com/gpu/m"}
