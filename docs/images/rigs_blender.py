"""Makes docs/images/rig_<rig>.png (one per rig of ``sapiens2.mocap.rigs.RIG_NAMES``) and docs/images/rigs.png (all
of them side by side): one mid-stride frame of the planted synthetic walk of ``tests/mocap_synth.py``, retargeted onto
each rig with the rig's own proportions (``rigs.retarget(..., proportions="rig")``; ``sapiens2`` is our skeleton as
solved), written as FBX by ``fbx.write_fbx_scene`` with the rig's bone axes, then imported by Blender's own FBX
importer (``bpy``, headless, in its own Python) and rendered with the Workbench engine. An armature does not render,
so the script draws what the importer made: an octahedral bone (Blender's bone shape) from each pose bone's head to
each child's head and a ball on every joint; blue the left side, red the right, grey the middle, small dark balls
the joints that follow none of ours.

Run from the repository root (Blender's Python from ``$SAPIENS2_BPY_PYTHON``, else ``.venv-bpy/bin/python``):
python docs/images/rigs_blender.py"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from mocap_synth import walk_clip  # noqa: E402

from sapiens2.mocap.fbx import FbxTrack, write_fbx_scene  # noqa: E402
from sapiens2.mocap.rigs import RIG_NAMES, RIGS, retarget  # noqa: E402

WIDTH, HEIGHT = 480, 640
TITLES = {"sapiens2": "sapiens2 (ours)", "ue5": "ue5 (Manny)", "rigify": "rigify (DEF-)"}


def caption(name: str, joints: int) -> str:
    """The picture's label: the rig, its joint count and (for a standard rig) the rest pose of its table."""
    pose = f", {RIGS[name].pose} pose" if name in RIGS else ""
    return f"{TITLES.get(name, name)}: {joints} joints{pose}"

BLENDER_SCRIPT = r"""
import json, math, re, sys
import bpy
from mathutils import Vector
from bpy_extras.object_utils import world_to_camera_view

job = json.loads(sys.argv[-1])
bpy.ops.wm.read_factory_settings(use_empty=True)
scene = bpy.context.scene
bpy.ops.import_scene.fbx(filepath=job["fbx"])
scene.frame_set(job["frame"] + 1)  # the importer puts time 0 at frame 1
armature = next(o for o in scene.objects if o.type == "ARMATURE")
heads = {b.name: armature.matrix_world @ b.head for b in armature.pose.bones}
parents = {b.name: b.parent.name if b.parent else None for b in armature.pose.bones}
for o in list(scene.objects):
    bpy.data.objects.remove(o)

def side(name):
    low = re.sub(r"\.\d+$", "", name.lower().replace("mixamorig:", ""))  # DEF-forearm.L.001: a twist segment
    if low.startswith(("left", "l_")) or low.endswith(("_l", ".l")):
        return "left"
    if low.startswith(("right", "r_")) or low.endswith(("_r", ".r")):
        return "right"
    return "middle"

COLOURS = {"left": (0.2, 0.45, 0.95, 1), "right": (0.9, 0.25, 0.2, 1), "middle": (0.78, 0.78, 0.74, 1),
           "unmapped": (0.15, 0.15, 0.15, 1), "ground": (0.93, 0.93, 0.9, 1)}
parts = {key: ([], []) for key in COLOURS}

def octahedron(a, b, width, key):
    # Blender's octahedral bone: a point at a, a square 10 % of the way to b, a point at b
    axis = b - a
    length = axis.length
    if length < 1e-3:
        return
    d = axis / length
    u = d.orthogonal().normalized()
    w = d.cross(u)
    r = min(width, 0.1 * length)
    ring = [a + 0.1 * axis + r * (math.cos(k * math.pi / 2) * u + math.sin(k * math.pi / 2) * w) for k in range(4)]
    verts, faces = parts[key]
    n = len(verts)
    verts.extend([a, *ring, b])
    for k in range(4):
        faces.append((n, n + 1 + (k + 1) % 4, n + 1 + k))
        faces.append((n + 5, n + 1 + k, n + 1 + (k + 1) % 4))

def ball(c, r, key, rings=8, segments=12):
    verts, faces = parts[key]
    n = len(verts)
    verts.append(c + Vector((0, 0, r)))
    for i in range(1, rings):
        t = math.pi * i / rings
        for k in range(segments):
            f = 2 * math.pi * k / segments
            verts.append(c + r * Vector((math.sin(t) * math.cos(f), math.sin(t) * math.sin(f), math.cos(t))))
    verts.append(c - Vector((0, 0, r)))
    last = len(verts) - 1
    ring = lambda i, k: n + 1 + (i - 1) * segments + k % segments
    for k in range(segments):
        faces.append((n, ring(1, k), ring(1, k + 1)))
        faces.append((last, ring(rings - 1, k + 1), ring(rings - 1, k)))
        for i in range(1, rings - 1):
            faces.append((ring(i, k), ring(i + 1, k), ring(i + 1, k + 1), ring(i, k + 1)))

for name, head in heads.items():
    if parents[name]:
        octahedron(heads[parents[name]], head, 0.03, side(name))
    if name in job["unmapped"]:
        ball(head, 0.009, "unmapped")
    else:
        ball(head, 0.014, side(name))

points = list(heads.values())
low = min(p.z for p in points)
centre = sum(points, Vector()) / len(points)
square = ((-0.9, -0.9), (0.9, -0.9), (0.9, 0.9), (-0.9, 0.9))  # 1.8 m of floor under the feet, facing up
ground = [Vector((centre.x + x, centre.y + y, low - 0.015)) for x, y in square]
parts["ground"][0].extend(ground)
parts["ground"][1].append((0, 1, 2, 3))
for key, (verts, faces) in parts.items():
    if verts:
        mesh = bpy.data.meshes.new(key)
        mesh.from_pydata(verts, [], faces)
        mesh.update()
        obj = bpy.data.objects.new(key, mesh)
        obj.color = COLOURS[key]
        scene.collection.objects.link(obj)

top = max(p.z for p in points)
middle = Vector(((max(p.x for p in points) + min(p.x for p in points)) / 2,
                 (max(p.y for p in points) + min(p.y for p in points)) / 2, (top + low) / 2))
camera = bpy.data.objects.new("camera", bpy.data.cameras.new("camera"))
camera.data.lens = 50
scene.collection.objects.link(camera)
scene.camera = camera
scene.render.resolution_x, scene.render.resolution_y = job["size"]
view = Vector(job["view"]).normalized()
corners = points + [Vector((p.x, p.y, low)) for p in points]

def place(distance):
    camera.location = middle + distance * view
    camera.rotation_euler = (-view).to_track_quat("-Z", "Y").to_euler()
    bpy.context.view_layer.update()
    ndc = [world_to_camera_view(scene, camera, p) for p in corners]
    return max(max(abs(q.x - 0.5) for q in ndc) / 0.42, max(abs(q.y - 0.5) for q in ndc) / 0.40)

distance = 4.0
for _ in range(6):  # the picture shrinks about as 1 / distance
    distance *= place(distance)
place(distance)

scene.render.engine = "BLENDER_WORKBENCH"
shading = scene.display.shading
shading.light = "STUDIO"
shading.color_type = "OBJECT"
shading.show_shadows = True
shading.shadow_intensity = 0.5
shading.show_cavity = False
shading.use_world_space_lighting = True
shading.studio_light = "outdoor.sl"
shading.studiolight_rotate_z = math.atan2(view.y, view.x)
scene.display.light_direction = (-0.4, 0.3, -0.85)
scene.world = bpy.data.worlds.new("world")
scene.world.color = (1.0, 1.0, 1.0)
scene.render.film_transparent = False
scene.view_settings.view_transform = "Standard"
scene.render.image_settings.file_format = "PNG"
scene.render.filepath = job["png"]
bpy.ops.render.render(write_still=True)
"""


def blender_python() -> str:
    candidate = os.environ.get("SAPIENS2_BPY_PYTHON") or str(REPO / ".venv-bpy" / "bin" / "python")
    if not Path(candidate).exists():
        sys.exit(f"rigs_blender.py: no Blender Python at {candidate} (.venv-bpy/bin/pip install bpy==5.0.1, or set "
                 "SAPIENS2_BPY_PYTHON)")  # fmt: skip
    return candidate


def mid_stride(clip) -> int:
    """The frame of the first half of the walk whose ankles are furthest apart."""
    names = clip.motion.skeleton.names
    feet = clip.joints[:, [names.index("l_foot"), names.index("r_foot")]]
    apart = np.linalg.norm(feet[:, 0] - feet[:, 1], axis=-1)
    return int(np.argmax(apart[: len(apart) // 2]))


def view_direction(clip, frame: int) -> list[float]:
    """From the body towards the camera in Blender's axes ((x, y, z) camera -> (x, z, -y)): in front of the person,
    45 degrees round to their right and 12 degrees up."""
    names = clip.motion.skeleton.names
    joints = clip.joints[frame]
    left = joints[names.index("l_thigh")] - joints[names.index("r_thigh")]
    up = joints[names.index("neck")] - joints[names.index("pelvis")]
    to_y_up = np.array([[1.0, 0, 0], [0, 0, 1], [0, -1, 0]])  # camera axes -> Blender's
    left, up = to_y_up @ left, to_y_up @ up
    up = np.array([0.0, 0.0, 1.0])
    left = left - up * (left @ up)
    left /= np.linalg.norm(left)
    front = np.cross(left, up)  # the person's left x up = their front
    turn = np.radians(-45.0)
    direction = np.cos(turn) * front + np.sin(turn) * left + np.tan(np.radians(12.0)) * up
    return (direction / np.linalg.norm(direction)).tolist()


def label(picture: np.ndarray, text: str, scale: float = 0.8) -> np.ndarray:
    picture = picture.copy()
    cv2.putText(picture, text, (round(17 * scale), round(40 * scale)), cv2.FONT_HERSHEY_SIMPLEX, scale, (40, 40, 40),
                2 if scale > 0.6 else 1, cv2.LINE_AA)  # fmt: skip
    return picture


def write_small(path: Path, picture: np.ndarray, colours: int = 64) -> None:
    """A PNG of at most ``colours`` colours (k-means on the pixels), so each picture stays some tens of KB."""
    pixels = picture.reshape(-1, 3).astype(np.float32)
    criteria = (cv2.TERM_CRITERIA_EPS + cv2.TERM_CRITERIA_MAX_ITER, 20, 0.5)
    cv2.setRNGSeed(0)
    _, labels, centres = cv2.kmeans(pixels[::7], colours, None, criteria, 2, cv2.KMEANS_PP_CENTERS)
    nearest = np.empty(len(pixels), np.int64)
    for start in range(0, len(pixels), 65536):
        chunk = pixels[start : start + 65536]
        nearest[start : start + 65536] = ((chunk[:, None] - centres[None]) ** 2).sum(-1).argmin(1)
    quantised = centres.round().astype(np.uint8)[nearest].reshape(picture.shape)
    cv2.imwrite(str(path), quantised, [cv2.IMWRITE_PNG_COMPRESSION, 9])


def main() -> None:
    out = Path(__file__).resolve().parent
    python = blender_python()
    clip = walk_clip(planted=True)
    frame = mid_stride(clip)
    view = view_direction(clip, frame)
    pictures = []
    with tempfile.TemporaryDirectory() as folder:
        for name in RIG_NAMES:
            rigged = retarget(clip.motion, name, proportions="rig")
            fbx = write_fbx_scene([FbxTrack("track", rigged.motion, orientations=rigged.orientations)],
                                  Path(folder) / f"{name}.fbx")  # fmt: skip
            names = rigged.motion.skeleton.names
            unmapped = [] if name == "sapiens2" else [n for n in names if n not in RIGS[name].mapping]
            job = {"fbx": str(fbx), "frame": frame, "png": str(Path(folder) / f"{name}.png"), "size": [WIDTH, HEIGHT],
                   "view": view, "unmapped": unmapped}  # fmt: skip
            script = Path(folder) / "render.py"
            script.write_text(BLENDER_SCRIPT)
            subprocess.run([python, str(script), json.dumps(job)], check=True, capture_output=True, timeout=600)
            picture = cv2.imread(job["png"])
            write_small(out / f"rig_{name}.png", label(picture, caption(name, len(names))))
            small = cv2.resize(picture, (WIDTH // 2, HEIGHT // 2), interpolation=cv2.INTER_AREA)
            pictures.append(label(small, f"{name}: {len(names)} joints", 0.5))
            print(f"rig_{name}.png: {len(names)} joints, frame {frame}")
    write_small(out / "rigs.png", np.concatenate(pictures, axis=1))


if __name__ == "__main__":
    main()
