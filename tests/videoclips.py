"""Short synthetic clips for the video tests, made with PyAV from the committed test photos (no media committed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
from conftest import DATA


def photo(name: str = "astronaut.png") -> np.ndarray:
    image = cv2.imread(str(DATA / name), cv2.IMREAD_COLOR)
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def moving_crops(count: int, size: tuple[int, int] = (96, 128)) -> Iterator[np.ndarray]:
    """A window panning across the astronaut photo."""
    image = photo()
    height, width = size
    for i in range(count):
        x = (i * 5) % (image.shape[1] - width)
        y = (i * 3) % (image.shape[0] - height)
        yield np.ascontiguousarray(image[y : y + height, x : x + width])


def person_crops() -> tuple[np.ndarray, np.ndarray]:
    """Two 'people': the astronaut's upper body and the cameraman, 40x24 pixels each."""
    a = cv2.resize(photo()[20:420, 130:370], (24, 40), interpolation=cv2.INTER_AREA)
    b = cv2.resize(photo("camera.png")[40:440, 150:390], (24, 40), interpolation=cv2.INTER_AREA)
    return a, b


def crossing(count: int, size: tuple[int, int] = (96, 160)) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Two pasted people walking towards each other and past; returns frames and per-frame true boxes (2, 4)."""
    a, b = person_crops()
    height, width = size
    frames, boxes = [], []
    for i in range(count):
        canvas = np.full((height, width, 3), 90, np.uint8)
        xa = int(10 + i * (width - 44) / max(count - 1, 1))
        xb = int(width - 34 - i * (width - 44) / max(count - 1, 1))
        y = 30
        canvas[y : y + 40, xb : xb + 24] = b
        canvas[y : y + 40, xa : xa + 24] = a  # a passes in front of b
        frames.append(canvas)
        boxes.append(np.array([[xa, y, xa + 24, y + 40], [xb, y, xb + 24, y + 40]], np.float64))
    return frames, boxes


def static_noisy(
    count: int, size: tuple[int, int] = (96, 128), sigma: float = 8.0, seed: int = 0
) -> Iterator[np.ndarray]:
    """One still frame with fresh Gaussian pixel noise each frame (a camera on a tripod)."""
    rng = np.random.default_rng(seed)
    base = cv2.resize(photo(), (size[1], size[0]), interpolation=cv2.INTER_AREA).astype(np.float32)
    for _ in range(count):
        yield np.clip(base + rng.normal(0, sigma, base.shape), 0, 255).astype(np.uint8)


def write_clip(
    path: Path,
    frames: Iterator[np.ndarray] | list[np.ndarray],
    *,
    fps: int = 25,
    codec: str = "libx264",
    audio: bool | str = False,
    rotation: int | None = None,
    times: Callable[[int], float] | None = None,
    bframes: int = 0,
    timescale: int | None = None,
) -> Path:
    """Encode RGB frames; ``audio`` adds a 440 Hz tone as long as the video (``True``: AAC, or an encoder name:
    ``libopus``, ``vorbis``, ``libmp3lame``, ``pcm_s16le`` ...); ``times(i)`` gives variable frame times in seconds;
    ``rotation`` sets the display matrix (counter-clockwise degrees); ``bframes`` B-frames (libx264);
    ``timescale`` the time base 1/timescale the file's video stream gets (mov/mp4: 600 as phones write, 1000, fps;
    an avi always gets 1/fps, mkv and webm 1/1000)."""
    import av

    frames = list(frames)
    height, width = frames[0].shape[:2]
    avi = path.suffix.lower() == ".avi"
    options = {"video_track_timescale": str(timescale)} if timescale else {}
    with av.open(str(path), "w", options=options) as out:
        settings = {"bf": str(bframes)} if codec == "libx264" else {}
        stream = out.add_stream(codec, rate=fps, options=settings)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        time_base = Fraction(1, fps) if avi else Fraction(1, timescale or fps * 1000)
        stream.time_base = stream.codec_context.time_base = time_base
        if rotation is not None:
            stream.set_display_rotation(rotation)
        sound = None
        if audio:
            name = "aac" if audio is True else audio
            sound = out.add_stream(name, rate=48000 if "opus" in name else 16000,
                                   layout="stereo" if name == "vorbis" else "mono")  # fmt: skip
            if name == "vorbis":
                sound.codec_context.options = {"strict": "experimental"}
        last = -1
        for i, image in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = last = max(round((times(i) if times else i / fps) / time_base), last + 1)
            frame.time_base = time_base
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
        if sound is not None:
            rate, channels = sound.codec_context.sample_rate, sound.codec_context.channels
            duration = (times(len(frames) - 1) if times else (len(frames) - 1) / fps) + 1 / fps
            samples = int(rate * duration)
            tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(samples) / rate)).astype(np.float32)
            for start in range(0, samples, 1024):
                chunk = np.repeat(tone[start : start + 1024][None], channels, axis=0)
                aframe = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo" if channels == 2 else "mono")
                aframe.sample_rate, aframe.pts = rate, start
                for packet in sound.encode(aframe):
                    out.mux(packet)
            for packet in sound.encode(None):
                out.mux(packet)
    return path


def irregular_times(fps: int) -> Callable[[int], float]:
    """Variable frame rate: frame gaps cycle through 0.8, 1.0, 1.4 and 2.0 frame periods (a phone that drops and
    bunches frames)."""
    gaps = np.array([0.8, 1.0, 1.4, 2.0]) / fps

    def time(i: int) -> float:
        return float(gaps.sum() * (i // 4) + gaps[: i % 4].sum())

    return time


def probe(path: Path) -> dict:
    """Frame count, video pts in seconds, audio packet count and size of a file."""
    import av

    with av.open(str(path)) as container:
        video = container.streams.video[0]
        times, shape = [], None
        for frame in container.decode(video):
            times.append(float(frame.pts * video.time_base))
            shape = (frame.height, frame.width)
    with av.open(str(path)) as container:
        audio = sum(1 for s in container.streams.audio for _ in container.demux(s) if _.size)
    return {"frames": len(times), "times": times, "audio_packets": audio, "size": shape}


# ------------------------------------------------------------------------------- two people crossing, one hidden


def _silhouette(canvas: np.ndarray, label: np.ndarray, value: int, box: np.ndarray, colours) -> None:
    """Draw a blocky person filling ``box`` (xyxy): a head (top 18 %, 40 % wide), a shirt (next 42 %) and trousers
    (the rest), each in its colour, into ``canvas`` and ``value`` into ``label``."""
    x1, y1, x2, y2 = (int(round(v)) for v in box)
    height, width = y2 - y1, x2 - x1
    head, shirt = y1 + int(0.18 * height), y1 + int(0.6 * height)
    cx, half = (x1 + x2) // 2, int(0.2 * width)
    parts = ((cx - half, y1, cx + half, head, colours[0]), (x1, head, x2, shirt, colours[1]),
             (x1, shirt, x2, y2, colours[2]))  # fmt: skip
    for a, b, c, d, colour in parts:
        canvas[b:d, a:c] = colour
        label[b:d, a:c] = value


def hidden_crossing(hidden: int, size: tuple[int, int] = (240, 320), seed: int = 0, changed: bool = False):
    """Two people walking across each other: A (red shirt, blue trousers) near the camera, walking right; B (green
    shirt, yellow trousers) farther (smaller, higher up), walking left behind A and fully hidden by A's body for
    ``hidden`` frames. Returns (frames (T, H, W, 3) RGB, true boxes (T, 2, 4) xyxy, detections): detections[t] is
    what a person detector would see, (boxes (N, 4), scores (N,), which person (N,): 0 A, 1 B): each person's
    visible pixels' box (+-1 px noise), scored by the visible fraction; a person under 15 % visible is missed.
    ``changed``: someone else comes out from behind A (B's clothes in other colours once past A's centre)."""
    rng = np.random.default_rng(seed)
    height, width = size
    size_a, size_b = (54, 150), (30, 80)  # (width, height)
    # B is missed (under 15 % visible: about 15 % of its width out) while the centres are this close
    slack = (size_a[0] - size_b[0]) / 2 + 0.15 * size_b[0]
    speed = 2 * slack / hidden  # relative px per frame: the centres pass through +-slack in ``hidden`` frames
    travel = 2 * (size_a[0] + size_b[0]) + 60
    count = int(np.ceil(travel / speed))
    ground = rng.integers(80, 120, (height, width, 3), dtype=np.uint8)  # a textured floor and wall
    frames, boxes, detections = [], [], []
    for t in range(count):
        gap = travel / 2 - speed * t  # B's centre minus A's
        ca, cb = width / 2 - gap / 3, width / 2 + 2 * gap / 3
        box_a = np.array([ca - size_a[0] / 2, 80, ca + size_a[0] / 2, 80 + size_a[1]])
        box_b = np.array([cb - size_b[0] / 2, 110, cb + size_b[0] / 2, 110 + size_b[1]])
        canvas, label = ground.copy(), np.zeros((height, width), np.uint8)
        clothes = ((40, 170, 60), (220, 200, 40)) if not (changed and gap < 0) else ((150, 60, 200), (30, 200, 210))
        _silhouette(canvas, label, 2, box_b, ((200, 160, 120), *clothes))
        _silhouette(canvas, label, 1, box_a, ((210, 170, 130), (200, 40, 40), (40, 60, 190)))  # A in front
        frames.append(canvas)
        boxes.append(np.stack([box_a, box_b]))
        found, scores, who = [], [], []
        for person, box in enumerate((box_a, box_b)):
            ys, xs = np.nonzero(label == person + 1)
            alone = np.zeros_like(label)
            _silhouette(np.zeros_like(canvas), alone, 1, box, ((0, 0, 0),) * 3)
            visible = len(xs) / max(int(alone.sum()), 1)
            if visible < 0.15:
                continue
            seen = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float64)
            found.append(seen + rng.normal(0, 1.0, 4))
            scores.append(0.9 * min(1.0, visible / 0.6))
            who.append(person)
        detections.append((np.array(found).reshape(-1, 4), np.array(scores), np.array(who, np.int64)))
    return np.stack(frames), np.stack(boxes), detections
