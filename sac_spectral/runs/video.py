"""Videos of episodes: MuJoCo rendered off-screen, written as ``.mp4`` or ``.gif``.

Rendering on a machine without a display needs an off-screen OpenGL backend, chosen by
``MUJOCO_GL`` before dm_control is first imported: :func:`use_offscreen_rendering` sets ``egl``
(Mesa's EGL renders on the CPU where there is no GPU; Debian packages ``libegl1``,
``libegl-mesa0``, ``libgl1-mesa-dri``) unless the variable names another backend.
:func:`gl_backend` refuses in one line what dm_control would fail on at its import: an unknown
``MUJOCO_GL``, or ``egl`` / ``osmesa`` without its library. ``.gif`` is written with Pillow;
``.mp4`` (H.264) with the ffmpeg binary that the ``imageio-ffmpeg`` wheel ships (the ``video``
extra). A video path that exists must be a regular file, which is replaced; a symbolic link is
followed and its target written (:func:`check_video_path`).

Frames are drawn without shadows and reflections unless asked (``shadows=True``): software
OpenGL draws them about 7× slower. Videos play in real time, at most :data:`MAX_FPS` frames per second: an env that
steps faster is rendered every k-th step.
"""

from __future__ import annotations

import gc
import io
import math
import os
import re
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sac_spectral.core.config import ConfigError, one_line
from sac_spectral.envs.episode import run_episode
from sac_spectral.runs.checkpoint import atomic_write, replaceable

VIDEO_SUFFIXES = (".mp4", ".gif")
MAX_FPS = 50
#: frame size (height, width)
DEFAULT_SIZE = (240, 320)
OFFSCREEN_BACKENDS = ("egl", "osmesa")
#: dm_control's values of ``MUJOCO_GL``: each backend and its synonyms ("" is glfw to dm_control)
GL_BACKENDS = {
    "egl": ("egl",),
    "osmesa": ("osmesa",),
    "glfw": ("glfw", "on", "enable", "enabled", "true", "1", ""),
    "disable": ("disable", "off", "disabled", "false", "0"),
}
#: the library each off-screen backend loads (as PyOpenGL names it) and the Debian packages that provide it
GL_LIBRARIES = {"egl": ("EGL", "libegl1 libegl-mesa0 libgl1-mesa-dri"), "osmesa": ("OSMesa", "libosmesa6")}


def check_video_path(path: str | Path) -> Path:
    """``path`` if it ends in a known suffix, its folder exists and its writer is installed, and
    it is new or a regular file (a symbolic link is followed: its target is what is written).
    A directory, pipe, device or socket is refused (``ConfigError``), before anything is rendered."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in VIDEO_SUFFIXES:
        raise ConfigError(f"video file '{path}': unknown extension '{path.suffix}'; use {' or '.join(VIDEO_SUFFIXES)}")
    if not path.parent.is_dir():
        raise ConfigError(f"video file '{path}': no such directory {path.parent}")
    target = replaceable(path)
    if not target.parent.is_dir():
        raise ConfigError(f"video file '{path}': a link to {target}, whose directory does not exist")
    if suffix == ".mp4" and video_suffix() != ".mp4":
        raise ConfigError("writing .mp4 needs imageio-ffmpeg (pip install -e '.[video]'); or write a .gif")
    return path


def video_suffix() -> str:
    """``.mp4`` where its writer (``imageio-ffmpeg``) is installed, else ``.gif``."""
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return ".gif"
    return ".mp4"


def gl_backend() -> str | None:
    """The backend ``MUJOCO_GL`` names (``egl``, ``osmesa``, ``glfw`` or ``disable``; ``None`` when
    unset). A one-line ``ConfigError`` where dm_control would fail at its import: a value it does
    not know, or ``egl`` / ``osmesa`` whose library is not installed."""
    value = os.environ.get("MUJOCO_GL")
    if value is None:
        return None
    backend = next((name for name, values in GL_BACKENDS.items() if value in values), None)
    if backend is None:
        raise ConfigError(f"MUJOCO_GL={value!r} is not an OpenGL backend dm_control knows; "
                          "use egl, osmesa, glfw or disable (or unset it)")
    if backend in GL_LIBRARIES and not library_loads(GL_LIBRARIES[backend][0]):
        library, packages = GL_LIBRARIES[backend]
        other = "egl" if backend == "osmesa" else "osmesa"
        raise ConfigError(f"MUJOCO_GL={backend} needs lib{library}, which is not installed (Debian: apt-get install "
                          f"{packages}); or use MUJOCO_GL={other}")
    return backend


def library_loads(library: str) -> bool:
    """Whether ``lib<library>.so`` loads, under the names PyOpenGL tries."""
    import ctypes

    for name in [f"lib{library}.so", *(f"lib{library}.so.{i}" for i in range(9, -1, -1))]:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def use_offscreen_rendering() -> str:
    """Choose a MuJoCo backend that renders (``MUJOCO_GL=egl`` unless it names one) before dm_control
    is imported; returns the backend. Raises ``ConfigError`` (one line) for a ``MUJOCO_GL`` that
    :func:`gl_backend` refuses, glfw without a display, or when dm_control was already imported
    with rendering disabled (the backend is fixed at its import)."""
    backend = gl_backend()
    if backend is not None and backend != "disable" and os.environ["MUJOCO_GL"] != "":
        if backend == "glfw":
            _init_glfw()
        return backend
    if "dm_control.mujoco" in sys.modules:
        raise ConfigError("rendering needs an off-screen OpenGL backend chosen before the first env is made: "
                          "set MUJOCO_GL=egl (or osmesa) in the environment")
    os.environ["MUJOCO_GL"] = "egl"
    gl_backend()  # libEGL is installed
    return "egl"


def _init_glfw() -> None:
    """Initialise GLFW as dm_control does at its import, but quietly: a one-line ``ConfigError``
    where it cannot (no display), instead of its warnings and a failure at the first frame."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise ConfigError("MUJOCO_GL=glfw renders in a window and needs a display, but DISPLAY is not set; "
                          "render off-screen with MUJOCO_GL=egl")
    try:
        import glfw
    except (ImportError, OSError) as err:
        raise ConfigError(f"MUJOCO_GL=glfw: the GLFW library does not load ({one_line(err)}); "
                          "render off-screen with MUJOCO_GL=egl") from None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ready = glfw.init()
    if not ready:
        why = "; ".join(re.sub(r"^\(\d+\) b'(.*)'$", r"\1", str(w.message)) for w in caught) or "glfwInit failed"
        raise ConfigError(f"MUJOCO_GL=glfw cannot open a window ({why}); render off-screen with MUJOCO_GL=egl")


def _dmc_physics(env: Any) -> Any:
    return getattr(getattr(env.unwrapped, "_env", None), "physics", None)


def step_seconds(env: Any) -> float | None:
    """Simulated seconds per env step (with its action repeat), if the env says."""
    repeat = getattr(env, "repeat", 1)
    inner = getattr(env.unwrapped, "_env", None)
    if inner is not None and hasattr(inner, "control_timestep"):
        return float(inner.control_timestep()) * repeat
    dt = getattr(env.unwrapped, "dt", None)
    return float(dt) * repeat if dt else None


def frame_schedule(env: Any, max_fps: int = MAX_FPS) -> tuple[int, float]:
    """``(every, fps)``: render every ``every``-th step and play at ``fps`` for real time."""
    dt = step_seconds(env)
    if dt is None:
        fps = float(env.metadata.get("render_fps") or 30)
        return 1, min(fps, max_fps)
    every = max(1, math.ceil(1.0 / (dt * max_fps)))
    return every, 1.0 / (dt * every)


def render(env: Any, size: tuple[int, int] = DEFAULT_SIZE, shadows: bool = False) -> np.ndarray:
    """One RGB frame ``[H, W, 3]`` uint8 of ``env``'s current state (DMC: camera 0). Without
    ``shadows`` a DMC frame is drawn with no shadows and no reflections (model fields that only
    drawing reads, restored after it): about 7× faster in software OpenGL."""
    physics = _dmc_physics(env)
    if physics is None and getattr(env, "render_mode", None) != "rgb_array":
        spec = getattr(env, "spec", None)
        raise ConfigError(f"cannot render {spec.id if spec else env}: not a dm_control env, and not made with "
                          "render_mode='rgb_array'")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="glfw")  # its failures are warnings, then an error below
            if physics is not None:
                return _render_physics(physics, size, shadows)
            return np.asarray(env.render(), dtype=np.uint8)
    except Exception as err:  # noqa: BLE001 - OpenGL backends fail in many ways; say what to set
        message = (f"rendering failed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                   f"MUJOCO_GL={os.environ.get('MUJOCO_GL', '')!r}: use MUJOCO_GL=egl (libegl1, libegl-mesa0) "
                   "or osmesa (libosmesa6)")
        _free_quietly(err)
    raise ConfigError(message)


def _free_quietly(err: BaseException) -> None:
    """Free what the frames of a failed render hold, without the tracebacks that the ``__del__``
    of a half-made OpenGL context (dm_control's ``MjrContext``) prints."""
    hook, sys.unraisablehook = sys.unraisablehook, lambda _: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traceback.clear_frames(err.__traceback__)
            gc.collect()
    finally:
        sys.unraisablehook = hook


def _render_physics(physics: Any, size: tuple[int, int], shadows: bool) -> np.ndarray:
    if shadows:
        return np.asarray(physics.render(size[0], size[1], camera_id=0), dtype=np.uint8)
    model = physics.model
    cast, reflect = model.light_castshadow.copy(), model.mat_reflectance.copy()
    model.light_castshadow[:] = 0
    model.mat_reflectance[:] = 0
    try:
        return np.asarray(physics.render(size[0], size[1], camera_id=0), dtype=np.uint8)
    finally:
        model.light_castshadow[:] = cast
        model.mat_reflectance[:] = reflect


def rollout(policy_fn: Callable[[np.ndarray], np.ndarray], env: Any, seed: int, size: tuple[int, int] = DEFAULT_SIZE,
            max_fps: int = MAX_FPS, shadows: bool = False) -> tuple[float, np.ndarray, float]:
    """Play one episode from ``env.reset(seed=seed)`` rendering it: ``(return, frames [T, H, W, 3], fps)``."""
    every, fps = frame_schedule(env, max_fps)
    frames: list[np.ndarray] = []

    def grab(env: Any, t: int, done: bool) -> None:
        if t % every == 0 or done:
            frames.append(render(env, size, shadows))

    total = run_episode(policy_fn, env, seed, grab)
    return total, np.stack(frames), fps


def write_video(path: str | Path, frames: np.ndarray, fps: float) -> None:
    """Write ``frames [T, H, W, 3]`` uint8 to ``path`` (.mp4 or .gif) atomically."""
    path = check_video_path(path)
    if path.suffix.lower() == ".gif":
        atomic_write(path, lambda f: f.write(gif_bytes(frames, fps)))
        return
    import imageio_ffmpeg

    h, w = frames.shape[1:3]
    target = replaceable(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".mp4")
    os.close(fd)
    try:
        # H.264 in yuv420p (what browsers and players read) needs even sizes; 16 keeps ffmpeg quiet
        writer = imageio_ffmpeg.write_frames(tmp, (w, h), fps=fps, codec="libx264", pix_fmt_out="yuv420p",
                                             macro_block_size=16 if h % 16 == 0 and w % 16 == 0 else 2,
                                             ffmpeg_log_level="error")
        writer.send(None)
        for frame in frames:
            writer.send(np.ascontiguousarray(frame))
        writer.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


def gif_bytes(frames: np.ndarray, fps: float) -> bytes:
    """An endlessly looping animated GIF of ``frames`` (GIF delays are whole centiseconds)."""
    from PIL import Image

    # a fast octree palette per frame: Pillow's default (median cut) costs about 12× more
    images = [Image.fromarray(np.asarray(f, dtype=np.uint8)).quantize(256, method=Image.Quantize.FASTOCTREE)
              for f in frames]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:],
                   duration=max(20, round(1000.0 / fps / 10) * 10), loop=0)
    return buf.getvalue()


def record_episode(policy_fn: Callable[[np.ndarray], np.ndarray], env: Any, seed: int, path: str | Path | None,
                   size: tuple[int, int] = DEFAULT_SIZE, max_fps: int = MAX_FPS, shadows: bool = False) -> np.ndarray:
    """Play one episode from ``env.reset(seed=seed)`` with ``policy_fn(obs) -> action``, write it
    to ``path`` (.mp4 or .gif; ``None``: don't write) and return its frames ``[T, H, W, 3]`` uint8."""
    _, frames, fps = rollout(policy_fn, env, seed, size, max_fps, shadows)
    if path is not None:
        write_video(path, frames, fps)
    return frames
