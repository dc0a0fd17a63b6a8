"""The Gradio page: ``build_app(options)`` returns the app object (a ``gradio.Blocks``), ``launch(options)`` serves it.

Layout: the photo (upload or a packaged sample), the tasks to run and the pose display choices on the left; on the
right the status (models, per-task timings, errors), every result side by side at the photo's resolution, the seg
legend with per-class toggles and the files ``sapiens2 predict`` writes, for download. Requests go through Gradio's
queue (one model run at a time, each waiting request sees its place); any failure becomes a message on the page,
never a stopped server.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..labels import is_released_set, names_of
from ..memory import release_free_memory
from ..metadata import KeypointMetadata, SegMetadata
from ..predict.options import OptionText, python_option
from ..predict.writers import LABELS_FORMAT
from ..tasks import TASKS
from . import render
from .analysis import Analysis, UploadError, analyse, read_upload, rewrite_pose
from .models import ModelCache
from .options import DemoOptions
from .sessions import RequestFolders, ResultStore

__all__ = ["build_app", "launch"]

logger = logging.getLogger(__name__)

KEYPOINT_SETS = [("Sapiens 308", "sapiens308"), ("COCO-WholeBody 133", "coco_wholebody133"), ("COCO 17", "coco17")]
"""The keypoint-set choices of a model of the 308 keypoints: the 308 and its conversions (``pose.keypoints``)."""
OWN_KEYPOINTS = LABELS_FORMAT
"""The keypoint-set value of a model of its own keypoints (``sapiens2.labels``): its set as it is, the only choice."""
_KEPT_REQUESTS = 64  # the newest requests' files stay on disk for download; older folders are removed
_KEPT_FILE_BYTES = 4 << 30  # ... and at most 4 GB of them (a 12-megapixel photo's files with every task: ~1 GB)
_RETAINED = ("seg", "pose")  # results the page still needs after a run (class toggles, keypoint-set choice)
_INTRO = (
    "# Sapiens2\n"
    "Drop a photo with people (or pick a sample), tick the tasks and press **Run**. Every result is computed at the "
    "photo's full resolution (enlarge an image to see it); the files below are those `sapiens2 predict` writes."
)


def _import_gradio():
    try:
        import gradio
    except ImportError:
        raise ImportError("the demo needs Gradio: pip install 'sapiens2[demo]'") from None
    return gradio


def build_app(options: DemoOptions | None = None, *, option: OptionText = python_option) -> Any:
    """The demo page as a ``gradio.Blocks``, queue set up; models load on first use.

    Example (a Hugging Face Space's ``app.py``, or a notebook cell):
        >>> from sapiens2.demo import build_app
        >>> build_app().launch()

    Args:
        options: models, device and limits (default ``DemoOptions()``: the released 1b models, downloaded once).
        option: how messages name an option (the CLI passes its flag names).

    Raises:
        ValueError: options that cannot work (``DemoOptions.check``).
        ImportError: Gradio is not installed (``pip install 'sapiens2[demo]'``).
    """
    options = options or DemoOptions()
    options.check(option)
    gr = _import_gradio()
    cache = ModelCache(options, option)
    folders = RequestFolders(_KEPT_REQUESTS, _KEPT_FILE_BYTES)  # removed when the server stops (launch) or at exit
    kept = ResultStore(options.max_kept_results, int(options.max_kept_mb * 1e6))
    page_classes, page_keypoints = cache.labels("seg"), cache.labels("pose")  # the models' files say, or the released
    body_parts = is_released_set(page_classes)  # the 29 are body parts; a list of one's own may be anything
    gr.set_static_paths([str(path.parent) for path in options.samples])  # packaged samples, wherever installed

    with gr.Blocks(title="Sapiens2 demo", analytics_enabled=False, delete_cache=(1800, 3600)) as app:
        # A page holds the key of its last results; the arrays stay in ``kept`` (bounded), dropped with the session.
        state = gr.State(None, time_to_live=3600, delete_callback=kept.drop)
        gr.Markdown(_INTRO)
        with gr.Tab("Photo", elem_id="photo-tab"):
            with gr.Row():
                with gr.Column(scale=1, min_width=300):
                    upload = gr.File(label="Photo", type="filepath", elem_id="photo-upload")
                    gr.Examples([[str(path)] for path in options.samples], inputs=[upload], label="Sample photos")
                    tasks = gr.CheckboxGroup(list(TASKS), value=list(options.tasks), label="Tasks", elem_id="tasks")
                    run = gr.Button("Run", variant="primary", elem_id="run")
                    keypoints = gr.Radio(
                        label="Keypoint set", elem_id="keypoint-set", **keypoint_choices(page_keypoints)
                    )
                    boxes = gr.Checkbox(True, label="Person boxes", elem_id="person-boxes")
                with gr.Column(scale=3):
                    status = gr.Markdown(render.models_markdown(options, cache), elem_id="status")
                    with gr.Row():
                        views = {
                            "photo": _image(gr, "Photo", "view-photo"),
                            "seg": _image(gr, "Body parts (seg)" if body_parts else "Classes (seg)", "view-seg"),
                            "pose": _image(gr, "Pose", "view-pose"),
                            "normal": _image(gr, "Surface normals", "view-normal"),
                            "depth": _image(gr, "Depth (pointmap)", "view-depth"),
                            "albedo": _image(gr, "Albedo", "view-albedo"),
                            "matting": _image(gr, "Matting cut-out", "view-matting"),
                        }
                        mesh = gr.Model3D(
                            label="Pointmap in 3D (drag to turn; the person only when seg ran)",
                            clear_color=(0.12, 0.12, 0.14, 1.0),
                            height=360,
                            visible="hidden",  # mounted from the start: one made visible later draws nothing
                            min_width=260,
                            elem_id="view-mesh",
                        )
                    panel = "Body-part classes (seg)" if body_parts else "Classes (seg)"
                    with gr.Accordion(panel, open=True, visible=False) as seg_panel:
                        legend = gr.HTML(render.seg_legend(None, page_classes), elem_id="seg-legend")
                        names = list(page_classes.class_names)
                        classes = gr.CheckboxGroup(names, value=names, label="Shown", elem_id="seg-classes")
                    files = gr.File(
                        label="Downloads: the files sapiens2 predict writes",
                        file_count="multiple",
                        interactive=False,
                        elem_id="downloads",
                    )

        with gr.Tab("Short video", elem_id="video-tab"):
            video_keypoints = _video_tab(gr, options, cache, folders)

        view_outputs = [*views.values(), mesh, seg_panel, legend]
        label_controls = [classes, keypoints] + ([] if video_keypoints is None else [video_keypoints])
        progress_tracker = gr.Progress(track_tqdm=True)  # Gradio fills in the request's tracker (downloads too)

        def on_upload(path: str | None):
            if path is None:
                return gr.update(value=None, visible=False), render.models_markdown(options, cache)
            try:
                image = read_upload(path, options.max_megapixels, options.max_file_mb)
            except UploadError as error:
                gr.Warning(str(error))
                return gr.update(value=None, visible=False), render.error_markdown(str(error))
            except Exception as error:  # whatever happens, the page says so and the server goes on
                logger.exception("demo upload failed")
                return gr.update(value=None, visible=False), _failed(Path(path).name, error)
            height, width = image.shape[:2]
            note = f"**{Path(path).name}**: {width}×{height} pixels. Tick the tasks and press **Run**."
            return gr.update(value=image, visible=True), note

        def on_run(previous, path, ticked, keypoint_format, draw_boxes, shown, progress=progress_tracker):
            kept.drop(previous)  # this page's earlier results are replaced whatever happens now
            hidden = [gr.update(value=None, visible=False)] * len(views)
            hidden += [gr.update(value=None, visible="hidden"), gr.update(visible=False), render.seg_legend(None)]
            hidden += [gr.update(), gr.update()]  # the class toggles and the keypoint set as they are
            if path is None:
                return [None, render.error_markdown("drop a photo or pick a sample first"), None, *hidden]
            if not ticked:
                return [None, render.error_markdown("tick at least one task"), None, *hidden]
            try:
                image = read_upload(path, options.max_megapixels, options.max_file_mb)
            except UploadError as error:
                gr.Warning(str(error))
                return [None, render.error_markdown(str(error)), None, *hidden]
            except Exception as error:  # whatever happens, the page says so and the server goes on
                logger.exception("demo upload failed")
                return [None, _failed(Path(path).name, error), None, *hidden]
            try:
                analysis = analyse(
                    image,
                    Path(path).name,
                    ticked,
                    cache,
                    folders.new(),
                    keypoint_format=written_format(keypoint_format),
                    progress=lambda fraction, what: progress(fraction, desc=what),
                )
                # The controls follow the models that ran (a model of its own set whose file did not say so).
                seg_classes, pose_keypoints = analysis.labels("seg"), analysis.labels("pose")
                class_update, shown = _class_update(gr, seg_classes, shown)
                keypoint_update, keypoint_format = _keypoint_update(gr, pose_keypoints, keypoint_format)
                shown_views = _views(gr, analysis, keypoint_format, draw_boxes, shown)
            except Exception as error:  # whatever happens, the page says so and the server goes on
                logger.exception("demo request failed")
                return [None, _failed(None, error), None, *hidden]
            files_out = [str(p) for p in analysis.files()] or None
            key = kept.put(_retained(analysis))  # only what the toggles need: the photo, seg and pose
            status_text = render.status_markdown(analysis, cache)
            return [key, status_text, files_out, *shown_views, class_update, keypoint_update]

        def on_classes(key: str | None, shown):
            analysis = kept.get(key)
            seg = None if analysis is None else analysis.result("seg")
            if seg is None:
                return gr.update()
            try:
                return render.seg_picture(analysis.image, seg.labels, shown, analysis.labels("seg") or seg.class_names)
            except Exception:  # the picture stays as it was; the server goes on
                logger.exception("demo seg redraw failed")
                return gr.update()

        def on_pose_choice(key: str | None, keypoint_format, draw_boxes):
            analysis = kept.get(key)
            pose = None if analysis is None else analysis.result("pose")
            if pose is None:
                return gr.update(), gr.update()
            try:
                analysis.folder.mkdir(parents=True, exist_ok=True)  # an old request's folder may have gone
                keypoint_format = written_format(keypoint_format)
                rewrite_pose(analysis, keypoint_format)
                points = analysis.labels("pose")
                picture = render.pose_picture(analysis.image, pose, keypoint_format, draw_boxes, points)
            except Exception:  # the picture stays as it was; the server goes on
                logger.exception("demo pose redraw failed")
                return gr.update(), gr.update()
            return picture, [str(p) for p in analysis.files()]

        upload.change(_trimmed(on_upload), [upload], [views["photo"], status], concurrency_id="render",
                      concurrency_limit=4)  # fmt: skip
        run.click(
            _trimmed(on_run),
            [state, upload, tasks, keypoints, boxes, classes],
            [state, status, files, *view_outputs, classes, keypoints],
            concurrency_id="models",
            concurrency_limit=1,
        )
        classes.change(_trimmed(on_classes), [state, classes], [views["seg"]], concurrency_id="render",
                       concurrency_limit=4)  # fmt: skip
        for control in (keypoints, boxes):
            control.change(
                _trimmed(on_pose_choice),
                [state, keypoints, boxes],
                [views["pose"], files],
                concurrency_id="render",
                concurrency_limit=4,
            )

        def on_load():
            """A page opened after a model loaded shows its names (an exported network or a .pth file names them only
            once loaded)."""
            seg_now, pose_now = cache.labels("seg"), cache.labels("pose")
            same_points = names_of(pose_now) == names_of(page_keypoints)
            return [
                gr.update() if names_of(seg_now) == names_of(page_classes) else gr.update(**class_choices(seg_now)),
                *[gr.update() if same_points else gr.update(**keypoint_choices(pose_now))] * (len(label_controls) - 1),
            ]

        app.load(_trimmed(on_load), None, label_controls, concurrency_id="render", concurrency_limit=4,
                 api_visibility="private", show_progress="hidden")  # fmt: skip
    app.queue(max_size=options.queue_size, default_concurrency_limit=1)
    app.sapiens2_cache = cache  # for notebooks and tests: which models are loaded, and their load times
    app.sapiens2_kept = kept  # ... the results kept for the pages (bounded)
    app.sapiens2_folders = folders  # ... and the requests' files, removed with the server (and at exit)
    close = app.close

    def close_and_clean(*args, **kwargs) -> None:
        try:
            close(*args, **kwargs)
        finally:
            folders.close()

    app.close = close_and_clean
    return app


def _video_tab(gr, options: DemoOptions, cache: ModelCache, folders: RequestFolders) -> Any:
    """The short-video tab (inside the app's Blocks): a clip through ``sapiens2.video`` with the cached models.
    Returns its keypoint-set control (None without PyAV)."""
    import importlib.util

    if importlib.util.find_spec("av") is None:
        gr.Markdown("Video needs PyAV: `pip install 'sapiens2[video]'`, then restart the demo.")
        return None
    from .video import analyse_video

    with gr.Row():
        with gr.Column(scale=1, min_width=300):
            clip = gr.File(label="Short clip (mp4, mov, webm, ...)", type="filepath", elem_id="clip-upload")
            tasks = gr.CheckboxGroup(list(TASKS), value=["pose"], label="Tasks", elem_id="video-tasks")
            run = gr.Button("Run on the clip", variant="primary", elem_id="video-run")
            points = keypoint_choices(cache.labels("pose"))
            keypoints = gr.Radio(label="Keypoint set", elem_id="video-keypoints", **points)
        with gr.Column(scale=3):
            status = gr.Markdown(
                f"People are tracked across frames and their results smoothed, as `sapiens2 predict clip.mp4` does; "
                f"the first {options.max_video_frames} frames of a clip are processed.",
                elem_id="video-status",
            )
            overlay = gr.Video(label="Results drawn on the frames", interactive=False, elem_id="view-overlay")
            files = gr.File(
                label="Downloads: the files sapiens2 predict writes for a clip",
                file_count="multiple",
                interactive=False,
                elem_id="video-downloads",
            )
    progress_tracker = gr.Progress(track_tqdm=True)  # the frames' progress bar

    def on_video(path, ticked, keypoint_format, progress=progress_tracker):
        if path is None:
            return render.error_markdown("drop a clip first"), None, None, gr.update()
        if not ticked:
            return render.error_markdown("tick at least one task"), None, None, gr.update()
        try:
            folder = folders.new()
            outcome = analyse_video(path, ticked, cache, folder, max_frames=options.max_video_frames,
                                    max_file_mb=options.max_file_mb,
                                    keypoint_format=written_format(keypoint_format))  # fmt: skip
        except Exception as error:  # whatever happens, the page says so and the server goes on
            logger.exception("demo video request failed")
            return _failed(None, error), None, None, gr.update()
        ran_pose = "pose" in ticked and cache.is_loaded("pose")  # the control follows the pose model that ran
        keypoint_update = _keypoint_update(gr, cache.labels("pose") if ran_pose else None, keypoint_format)[0]
        try:
            downloads = download_files(outcome.files, folder)  # one distinct name each (chunks of several tasks)
        except OSError as error:
            logger.exception("demo video downloads failed")
            return _failed(None, error), None, None, keypoint_update
        overlay_path = None if outcome.overlay is None else str(outcome.overlay)
        status_text = render.video_markdown(outcome, options.max_video_frames)
        return status_text, overlay_path, downloads or None, keypoint_update

    run.click(_trimmed(on_video), [clip, tasks, keypoints], [status, overlay, files, keypoints],
              concurrency_id="models", concurrency_limit=1)  # fmt: skip
    return keypoints


def class_choices(classes: SegMetadata) -> dict[str, Any]:
    """The seg class toggles of a model of ``classes`` (``ModelCache.labels``): one per class, all shown."""
    names = list(classes.class_names)
    return {"choices": names, "value": names}


def keypoint_choices(points: KeypointMetadata) -> dict[str, Any]:
    """The keypoint-set control of a pose model of ``points`` (``ModelCache.labels``): the 308 and its conversions;
    for a model of its own keypoints (``sapiens2.labels``) that set alone, fixed, saying why the others do not apply."""
    if is_released_set(points):
        return {"choices": KEYPOINT_SETS, "value": "sapiens308", "interactive": True, "info": None}
    names = ", ".join(points.names[:4]) + (", ..." if len(points.names) > 4 else "")
    return {
        "choices": [(f"The model's own {len(points.names)} keypoints ({names})", OWN_KEYPOINTS)],
        "value": OWN_KEYPOINTS,
        "interactive": False,
        "info": "This pose model has keypoints of its own: COCO-WholeBody 133 and COCO 17 are conversions of the "
        "Sapiens 308 keypoints and do not apply to it.",
    }


def written_format(choice: str | None) -> str:
    """The ``keypoint_format`` the files are written and drawn in for the keypoint-set control's ``choice``: a
    model of its own keypoints writes them as they are whatever the format (``predict.writers``)."""
    return "sapiens308" if choice in (None, OWN_KEYPOINTS) else choice


def _class_update(gr, classes: SegMetadata | None, shown: list[str] | None) -> tuple[Any, list[str] | None]:
    """(update of the class toggles, the classes to show) after a run whose seg model has ``classes`` (None: seg
    did not run): its names, keeping the ticks when they are among them, else all shown (the page offered other
    names: its file did not say them)."""
    if classes is None:
        return gr.update(), shown
    names = list(classes.class_names)
    kept = list(shown or []) if set(shown or []) <= set(names) else names
    return gr.update(choices=names, value=kept), kept


def _keypoint_update(gr, points: KeypointMetadata | None, choice: str | None) -> tuple[Any, str | None]:
    """(update of the keypoint-set control, the choice to draw) after a run whose pose model has ``points`` (None:
    pose did not run): the control as ``keypoint_choices`` makes it when the page offered another kind of set."""
    if points is None or (choice == OWN_KEYPOINTS) == (not is_released_set(points)):
        return gr.update(), choice
    update = keypoint_choices(points)
    return gr.update(**update), update["value"]


def _trimmed(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler`` (a page event), then the C heap's free pages back to the system (``memory``): Gradio runs
    each event on a thread of its pool, and glibc would keep every thread's freed images and maps in that thread's
    arena, so a server that ran for days would hold the largest request of each thread. Gradio reads the handler's
    own signature (``functools.wraps``), progress parameter included."""

    @functools.wraps(handler)
    def answer(*args: Any, **kwargs: Any) -> Any:
        try:
            return handler(*args, **kwargs)
        finally:
            release_free_memory()

    return answer


def download_files(files, folder: str | os.PathLike) -> list[str]:
    """The files to offer for download, each under a distinct name: a browser saves a download under its file name
    alone, so ``clip_seg/chunk_000000.npz`` and ``clip_normal/chunk_000000.npz`` would both arrive as
    ``chunk_000000.npz``. Files in subfolders of ``folder`` are offered as a link named after their path
    (``clip_seg_chunk_000000.npz``); the others as they are."""
    folder = Path(folder)
    offered, names = [], set()
    for path in map(Path, files):
        try:
            relative = path.relative_to(folder)
        except ValueError:
            relative = Path(path.name)
        if relative.parts[0] == "_downloads":  # offered before
            relative = Path(path.name)
        name = "_".join(relative.parts)
        stem, suffix, number = Path(name).stem, Path(name).suffix, 1
        while name in names:  # still the same name: number it
            number += 1
            name = f"{stem}_{number}{suffix}"
        names.add(name)
        if name == path.name and (relative.parent == Path(".") or path.parent.name == "_downloads"):
            offered.append(str(path))
            continue
        link = folder / "_downloads" / name
        link.parent.mkdir(exist_ok=True)
        if not link.exists():
            try:
                os.link(path, link)  # no copy on disk
            except OSError:
                shutil.copyfile(path, link)
        offered.append(str(link))
    return offered


def _failed(name: str | None, error: Exception) -> str:
    """A request that failed, in one line on the page (the server's log has the traceback)."""
    where = f"{name!r}: " if name else ""
    return render.error_markdown(f"{where}the request failed: {type(error).__name__}: {error}")


def _retained(analysis: Analysis) -> Analysis:
    """What the page needs after a run (the photo, the seg and pose results, every task's files): the other
    full-size results (normals, pointmaps, albedo, mattes: up to 48 bytes a pixel) are not kept."""
    outcomes = {
        task: outcome if task in _RETAINED else dataclasses.replace(outcome, result=None)
        for task, outcome in analysis.outcomes.items()
    }
    return dataclasses.replace(analysis, outcomes=outcomes)


def _image(gr, label: str, elem_id: str):
    # PNG: lossless, so the shown picture is exactly the computed one, at full resolution.
    return gr.Image(label=label, format="png", interactive=False, visible=False, min_width=260, elem_id=elem_id)


def _views(gr, analysis: Analysis, keypoint_format: str, draw_boxes: bool, shown) -> list[Any]:
    """Updates for [photo, seg, pose, normal, depth, albedo, matting, mesh, seg panel, legend]."""

    def show(value):
        return gr.update(value=value, visible=value is not None)

    image = analysis.image
    seg, pose = analysis.result("seg"), analysis.result("pose")
    classes = analysis.labels("seg") or (None if seg is None else seg.class_names)
    points = analysis.labels("pose")
    written = written_format(keypoint_format)
    normal, pointmap = analysis.result("normal"), analysis.result("pointmap")
    albedo, matting = analysis.result("albedo"), analysis.result("matting")
    mesh_path = None
    if pointmap is not None:
        foreground = None if seg is None else seg.foreground()
        if foreground is not None and foreground.mean() < 0.01:  # (nearly) no person found: show everything
            foreground = None
        mesh_path = str(render.pointmap_glb(pointmap, image, analysis.folder / "pointmap_3d.glb", foreground))
    return [
        show(image),
        show(None if seg is None else render.seg_picture(image, seg.labels, shown, classes)),
        show(None if pose is None else render.pose_picture(image, pose, written, draw_boxes, points)),
        show(None if normal is None else render.normal_picture(normal)),
        show(None if pointmap is None else render.depth_picture(pointmap)),
        show(None if albedo is None else albedo.albedo),
        show(None if matting is None else render.matting_picture(matting)),
        gr.update(value=mesh_path, visible=True if mesh_path else "hidden"),
        gr.update(visible=seg is not None),
        render.seg_legend(None) if seg is None else render.seg_legend(seg.labels, classes),
    ]


def launch(options: DemoOptions | None = None, *, option: OptionText = python_option, block: bool = True) -> Any:
    """Build the app and serve it on ``options.host``:``options.port`` (``sapiens2 demo``); returns the app.

    The requests' files (a private temporary folder) are removed when the server stops: Ctrl+C, ``app.close()``,
    or the interpreter's exit.

    Args:
        block: wait until the server is stopped (Ctrl+C); False returns at once with the server running.
    """
    options = options or DemoOptions()
    app = build_app(options, option=option)
    try:
        app.launch(
            server_name=options.host,
            server_port=options.port,
            share=options.share,
            max_file_size=f"{int(options.max_file_mb * 1e6)}b",
            prevent_thread_lock=not block,
            show_error=True,
        )
    except BaseException:
        app.sapiens2_folders.close()
        raise
    if block:  # the server has stopped
        app.sapiens2_folders.close()
    return app
