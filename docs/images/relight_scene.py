"""Makes docs/images/relight_scene.png: a synthetic scene (two spheres before a checker wall, known normals and
albedo, shot under an overcast sky) relit by ``sapiens2.vfx.relight`` under the presets and a --light spec.
Run from the repository root: python docs/images/relight_scene.py"""

import cv2
import numpy as np

from sapiens2.vfx import Lighting, load_environment, parse_light, relight
from sapiens2.vfx.relight import linear_to_srgb, srgb_to_linear

H, W, F = 150, 120, 150.0
u, v = np.meshgrid(np.arange(W) + 0.5 - W / 2, np.arange(H) + 0.5 - H / 2)
rays = np.stack([u / F, v / F, np.ones_like(u)], -1)
rays /= np.linalg.norm(rays, axis=-1, keepdims=True)
depth = np.full((H, W), 6.0 / rays[..., 2])  # the wall, 6 m away
normals = np.broadcast_to(np.array([0.0, 0.0, -1.0]), (H, W, 3)).copy()
albedo = np.zeros((H, W, 3))
points = rays * depth[..., None]
checker = (np.floor(points[..., 0] * 1.5) + np.floor(points[..., 1] * 1.5)) % 2
albedo[:] = np.where(checker[..., None] > 0, [0.62, 0.6, 0.55], [0.42, 0.4, 0.38])
matte = np.zeros((H, W), bool)
for centre, radius, colour in (((0.0, 0.45, 3.0), 0.7, (0.75, 0.5, 0.38)), ((0.0, -0.62, 3.0), 0.36, (0.8, 0.58, 0.46))):
    c = np.array(centre)
    b = rays @ c
    disc = b * b - (c @ c - radius**2)
    t = b - np.sqrt(np.maximum(disc, 0))
    hit = (disc > 0) & (t < depth)
    depth = np.where(hit, t, depth)
    p = rays * t[..., None]
    normals[hit] = ((p - c) / radius)[hit]
    albedo[hit] = colour
    matte |= hit
albedo = linear_to_srgb(albedo)  # the albedo model's values are sRGB-encoded
sky = load_environment("overcast")
plate = relight(np.zeros((H, W, 3), np.uint8), normals, albedo, sky).image
panels = [("plate", plate)]
for name, lighting in (("studio", load_environment("studio")), ("neon", load_environment("neon")),
                       ("sunset", load_environment("sunset")),
                       ("--light dir:az=90", Lighting([parse_light("dir:az=90,el=10,color=#ffd0a0,intensity=2")]))):
    panels.append((name, relight(plate, normals, albedo, lighting, matte=matte, keep_shading=True).image))
row = []
for name, image in panels:
    image = image.copy()
    cv2.putText(image, name, (4, H - 6), cv2.FONT_HERSHEY_SIMPLEX, 0.38, (255, 255, 255), 1, cv2.LINE_AA)
    row.append(np.pad(image, ((0, 0), (0, 2), (0, 0)), constant_values=255))
picture = np.concatenate(row, axis=1)[:, :-2]
cv2.imwrite("docs/images/relight_scene.png", cv2.cvtColor(picture, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 9])
print(picture.shape, srgb_to_linear(plate).mean())
