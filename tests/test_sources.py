"""Input expansion: files, folders (mirrored output stems), globs, ordering, duplicates and error items."""

from __future__ import annotations

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
