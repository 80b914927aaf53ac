"""installer.dirs: a staged directory replaces the real one whole, or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from installer.dirs import is_complete, mark_complete, remove_tree, staged_dir


def test_a_finished_stage_replaces_the_old_directory_in_one_rename(tmp_path: Path) -> None:
    final = tmp_path / "cache" / "modules" / "580"
    final.mkdir(parents=True)
    (final / "old.ko").write_text("old")
    with staged_dir(final) as staging:
        assert staging == final.with_name(".580.tmp") and staging.is_dir()
        (staging / "nvidia.ko").write_text("new")
        mark_complete(staging, "580 6.1 open\n")
        assert not is_complete(final)
    assert sorted(p.name for p in final.iterdir()) == [".complete", "nvidia.ko"]
    assert is_complete(final) and (final / ".complete").read_text() == "580 6.1 open\n"
    assert sorted(p.name for p in final.parent.iterdir()) == ["580"]


def test_a_failed_stage_leaves_the_old_directory_and_no_staging(tmp_path: Path) -> None:
    final = tmp_path / "versions" / "580"
    final.mkdir(parents=True)
    (final / "keep").write_text("old")
    with pytest.raises(RuntimeError), staged_dir(final) as staging:
        (staging / "half").write_text("x")
        raise RuntimeError("killed mid-way")
    assert sorted(p.name for p in final.parent.iterdir()) == ["580"]
    assert sorted(p.name for p in final.iterdir()) == ["keep"]


def test_a_stale_staging_dir_from_a_killed_run_is_cleared_first(tmp_path: Path) -> None:
    final = tmp_path / "extracted" / "580"
    stale = final.with_name(".580.pull")
    stale.mkdir(parents=True)
    (stale / "junk").write_text("x")
    with staged_dir(final, suffix=".pull", create=False) as staging:
        assert staging == stale and not staging.exists() and staging.parent.is_dir()
        staging.mkdir()  # a tool (makeself --target) makes it
        (staging / "nvidia-installer").write_text("#!/bin/sh\n")
    assert sorted(p.name for p in final.parent.iterdir()) == ["580"]
    assert (final / "nvidia-installer").is_file()


def test_remove_tree_takes_links_not_their_targets(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "f").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    remove_tree(link)
    assert not link.is_symlink() and (target / "f").is_file()
    remove_tree(target)
    remove_tree(tmp_path / "absent")
    assert list(tmp_path.iterdir()) == []
