"""Input expansion: files, folders (mirrored output stems), globs, ordering, duplicates and error items."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sapiens2.data.sources import InputItem, expand_inputs, usable


def _touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    _touch(
        root,
        "b.jpg",
        "a.PNG",
        "notes.txt",
        ".hidden.jpg",
        "day2/z.jpeg",
        "day1/c.webp",
        "day1/deeper/d.tif",
        ".cache/e.jpg",
    )
    return root


def _stems(items: list[InputItem]) -> list[str]:
    return [item.stem for item in items]


def test_folder_expands_recursively_to_mirrored_sorted_stems(photos: Path, tmp_path: Path) -> None:
    items = expand_inputs([str(photos)], tmp_path / "out")
    assert _stems(items) == ["a", "b", "day1/c", "day1/deeper/d", "day2/z"]
    assert all(item.ok for item in items)
    assert items[3].source == photos / "day1" / "deeper" / "d.tif"
    assert items[3].output_path("_seg.png") == tmp_path / "out" / "day1" / "deeper" / "d_seg.png"


def test_folder_without_recursion_takes_the_top_level_only(photos: Path, tmp_path: Path) -> None:
    assert _stems(expand_inputs(photos, tmp_path / "out", recursive=False)) == ["a", "b"]


def test_glob_patterns_keep_paths_relative_to_their_fixed_root(photos: Path, tmp_path: Path) -> None:
    items = expand_inputs([str(photos / "**" / "*.*")], tmp_path / "out")
    assert _stems(items) == ["a", "b", "day1/c", "day1/deeper/d", "day2/z"]  # notes.txt filtered out
    items = expand_inputs([str(photos / "day*" / "*.*")], tmp_path / "out")
    assert _stems(items) == ["day1/c", "day2/z"]


def test_explicit_files_are_taken_whatever_their_extension(photos: Path, tmp_path: Path) -> None:
    items = expand_inputs([photos / "notes.txt", photos / "day1" / "c.webp"], tmp_path / "out")
    assert _stems(items) == ["notes", "c"] and all(item.ok for item in items)


def test_missing_inputs_become_error_items_and_do_not_stop_the_rest(photos: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    inputs = [str(tmp_path / "nope.jpg"), str(photos / "b.jpg"), str(empty), str(photos / "*.gif")]
    items = expand_inputs(inputs, tmp_path / "out")
    assert [item.ok for item in items] == [False, True, False, False]
    assert "does not exist" in items[0].error and "nope.jpg" in items[0].error
    assert "contains no image files" in items[2].error
    assert "matches no image files" in items[3].error
    assert usable(items) == [items[1]]


def test_order_follows_inputs_and_repeated_files_are_kept_once(photos: Path, tmp_path: Path) -> None:
    items = expand_inputs([photos / "day2" / "z.jpeg", photos, str(photos / "b.jpg")], tmp_path / "out")
    assert _stems(items) == ["z", "a", "b", "day1/c", "day1/deeper/d"]
    assert len({item.source.resolve() for item in items}) == len(items)


def test_clashing_stems_are_made_unique(tmp_path: Path) -> None:
    _touch(tmp_path, "in/a.jpg", "in/a.png", "other/a.jpg", "other/A.jpg")
    items = expand_inputs([tmp_path / "in", tmp_path / "other" / "a.jpg", tmp_path / "other" / "A.jpg"], tmp_path)
    stems = _stems(items)
    assert stems[:2] == ["a", "a_png"]
    assert len({stem.casefold() for stem in stems}) == 4


def test_output_folder_inside_the_input_folder_is_skipped(photos: Path) -> None:
    _touch(photos, "out/b_seg.png")
    assert "out/b_seg" not in _stems(expand_inputs([photos], photos / "out"))


def test_deterministic_across_calls(photos: Path, tmp_path: Path) -> None:
    first = expand_inputs([photos, str(photos / "*.jpg")], tmp_path / "out")
    second = expand_inputs([photos, str(photos / "*.jpg")], tmp_path / "out")
    assert first == second


posix_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and symbolic links need a POSIX system")


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    """A folder of good files, special entries with image names, and folders named like images."""
    root = tmp_path / "in"
    _touch(root, "good.jpg", "folder.jpg/inner.png")
    (root / "empty_dir.jpg").mkdir()
    os.symlink("good.jpg", root / "link_to_good.png")
    os.symlink("self.jpg", root / "self.jpg")  # a link to itself
    os.symlink("pong.jpg", root / "ping.jpg")  # two links pointing at each other
    os.symlink("ping.jpg", root / "pong.jpg")
    os.symlink("missing.jpg", root / "dangling.jpg")
    os.mkfifo(root / "pipe.jpg")
    return root


BROKEN_REASONS = {
    "self.jpg": "symbolic link loop",
    "ping.jpg": "symbolic link loop",
    "pong.jpg": "symbolic link loop",
    "dangling.jpg": "dangling symbolic link",
    "pipe.jpg": "FIFO",
}


def _errors(items: list[InputItem]) -> dict[str, str]:
    errors: dict[str, str] = {}
    for item in items:
        if not item.ok:
            assert item.source.name not in errors, f"two error items for {item.source}"
            errors[item.source.name] = item.error
    return errors


def _check_errors(errors: dict[str, str], root: Path, names) -> None:
    assert set(errors) == set(names)
    for name in names:
        assert BROKEN_REASONS[name] in errors[name], errors[name]
        assert repr(str(root / name)) in errors[name] and "\n" not in errors[name]


@posix_only
def test_broken_entries_in_a_folder_give_one_error_item_each_and_the_rest_goes_on(broken: Path, tmp_path: Path) -> None:
    for inputs in ([broken], [broken, broken]):  # a folder given twice still reports each entry once
        items = expand_inputs(inputs, tmp_path / "out")
        assert sorted(item.stem for item in items if item.ok) == ["folder.jpg/inner", "good"]  # link = good.jpg
        _check_errors(_errors(items), broken, BROKEN_REASONS)
    assert "missing.jpg" in _errors(expand_inputs([broken], tmp_path / "out"))["dangling.jpg"]  # names the target
    top = expand_inputs([broken], tmp_path / "out", recursive=False)
    assert [item.stem for item in top if item.ok] == ["good"]
    _check_errors(_errors(top), broken, BROKEN_REASONS)


@posix_only
def test_broken_explicit_files_are_error_items_naming_the_file(broken: Path, tmp_path: Path) -> None:
    names = ["self.jpg", "dangling.jpg", "pipe.jpg", "ping.jpg"]
    items = expand_inputs([broken / name for name in names] + [broken / "link_to_good.png"], tmp_path / "out")
    assert [item.ok for item in items] == [False] * 4 + [True]
    _check_errors(_errors(items), broken, names)
    empty_dir = expand_inputs([broken / "empty_dir.jpg"], tmp_path / "out")
    assert not empty_dir[0].ok and "contains no image files" in empty_dir[0].error


@posix_only
def test_broken_glob_matches_are_error_items_and_folders_are_not_matched(broken: Path, tmp_path: Path) -> None:
    items = expand_inputs([str(broken / "*.jpg")], tmp_path / "out")
    assert [item.stem for item in items if item.ok] == ["good"]  # empty_dir.jpg and folder.jpg are folders
    _check_errors(_errors(items), broken, BROKEN_REASONS)


def test_a_renamed_file_never_takes_the_name_another_file_has(tmp_path: Path) -> None:
    _touch(tmp_path, "in/a.jpg", "in/a.png", "in/a_png.jpg")
    stems = {item.source.name: item.stem for item in expand_inputs([tmp_path / "in"], tmp_path / "out")}
    assert stems == {"a.jpg": "a", "a.png": "a_png_2", "a_png.jpg": "a_png"}  # the bulk reader's rule too


def test_an_input_folder_that_is_the_output_folder_is_an_error_item(photos: Path) -> None:
    items = expand_inputs([photos, str(photos / "*.jpg")], photos)
    assert len(items) == 2 and all("reads the output folder" in item.error for item in items)
