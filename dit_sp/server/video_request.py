"""An OpenAI ``POST /v1/videos`` request read into one generation's settings, and every check that can refuse it
before anything runs (``BadRequest``: a 400 with OpenAI's error shape, naming the field).

OpenAI's fields: ``prompt`` (required), ``model`` (the served one's name, or absent), ``size`` (``"WxH"``),
``seconds`` (mapped to frames at the model's fps when ``num_frames`` is absent) and ``input_reference`` (an
uploaded first frame, for an image-to-video model or a text-to-video checkpoint that is one too). Beyond them, the
names diffusers pipelines use: ``seed``, ``num_frames``, ``num_inference_steps``, ``guidance_scale``,
``guidance_scale_2`` and ``negative_prompt``; ``lora``, an adapter of the server's ``--lora-dir`` by name; and
``refine`` (true or false: the stage-2 refiner of a server started with ``--set refine=true``, on by default there).
A multipart form's values are text and a JSON body's are typed; both are read alike.
"""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path
from typing import Any

from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.inference.checks import check_image_inputs
from dit_sp.inference.config import GenerateConfig
from dit_sp.server.adapters import AdapterError, Adapters

EXTRA = {"seed": ("seed", int), "num_frames": ("frames", int), "num_inference_steps": ("steps", int),
         "guidance_scale": ("guidance", float), "guidance_scale_2": ("guidance_2", float),
         "negative_prompt": ("negative_prompt", str), "refine": ("refine", bool)}  # fmt: skip
"""Request field -> (``GenerateConfig`` field, type)."""
FIELDS = ("prompt", "model", "size", "seconds", "input_reference", "lora", *EXTRA)
FLAGS = {"--image PATH": "input_reference", "--image": "input_reference", "--last-image": "a last frame",
         "--frames": "num_frames", "--height": "size", "--width": "size", "--steps": "num_inference_steps",
         "--guidance-2": "guidance_scale_2", "--guidance": "guidance_scale",
         "--max-sequence-length": "prompt"}  # fmt: skip
"""The CLI's flag names in the library's messages, as a request names them."""
MAX_PROMPT_CHARS = 20_000


class BadRequest(Exception):
    """A request refused with 400 before it runs; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _as_request(message: str) -> str:
    for flag, name in FLAGS.items():
        message = message.replace(flag, name)
    return message


def _number(name: str, value: Any, kind: type) -> Any:
    if kind is bool:  # JSON's true/false, or a form's text
        if isinstance(value, bool) or value in ("true", "false"):
            return value in (True, "true")
        raise BadRequest(f"{name} must be true or false, got {value!r}", name)
    if kind is str:
        if not isinstance(value, str):
            raise BadRequest(f"{name} must be a string, got {value!r}", name)
        return value
    try:
        number = kind(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or (kind is int and isinstance(value, float) and not value.is_integer()):
        raise BadRequest(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}", name)
    return number


def _size(text: Any) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d{1,5})\s*[xX]\s*(\d{1,5})\s*", str(text))
    if match is None:
        raise BadRequest(f"size must be WIDTHxHEIGHT in pixels, e.g. 832x480, got {str(text)[:40]!r}", "size")
    return int(match[1]), int(match[2])


def check_image(data: bytes) -> None:
    """``BadRequest`` unless ``data`` is an image PIL can read."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except Exception as e:  # noqa: BLE001 - whatever PIL raises for a malformed upload
        raise BadRequest(f"input_reference is not an image this server can read ({type(e).__name__})",
                         "input_reference") from e  # fmt: skip


def _frames_for(base: GenerateConfig, seconds: float) -> int:
    """The frame count nearest ``seconds * fps + 1`` that the model takes (Wan: 4k + 1)."""
    from dit_sp.zoo import check_shape_from_files

    wanted = round(seconds * base.fps) + 1
    for frames in sorted(range(max(1, wanted - 8), wanted + 9), key=lambda f: (abs(f - wanted), f)):
        try:
            check_shape_from_files(base.model, dataclasses.asdict(base) | {"frames": frames})
            return frames
        except ConfigError:
            continue
    return wanted  # the full check below says why it does not fit


def _lora(name: Any, loras: Adapters | None) -> str:
    if loras is None:
        raise BadRequest("lora: this server was started without --lora-dir, so it has no adapters", "lora")
    names = loras.names()
    if name not in names:  # only a listed entry's name is ever joined to the directory
        raise BadRequest(f"lora {str(name)[:80]!r} is not one of this server's adapters: {', '.join(names) or 'none'}",
                         "lora")  # fmt: skip
    try:
        loras.check(name)
    except AdapterError as e:
        raise BadRequest(str(e), "lora") from e
    return name


def read_request(fields: dict[str, Any], image_path: str | None, base: GenerateConfig, served: str,
                 loras: Adapters | Path | None = None) -> tuple[GenerateConfig, dict[str, Any], str, str]:  # fmt: skip
    """``(config, settings, size, seconds)``: the request's generation settings over ``base`` (the served
    defaults), the fields it changed (``lora``: an adapter of ``loras`` by name, checked against the served
    model; a directory is read as ``Adapters(directory, base.model)``), and its size and seconds
    as OpenAI reports them. ``image_path``: the uploaded first frame, already saved (and checked by
    ``check_image``). ``BadRequest`` for anything wrong."""
    from dit_sp.zoo import check_shape_from_files, pipeline_class_name

    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}: this server takes {', '.join(FIELDS)}", unknown[0])
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadRequest("prompt is required: what the video shows", "prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BadRequest(f"prompt is {len(prompt)} characters; at most {MAX_PROMPT_CHARS}", "prompt")
    model = fields.get("model")
    if model not in (None, "", served):
        raise BadRequest(f"model {str(model)[:80]!r} is not served here; this server serves {served!r}", "model")
    settings: dict[str, Any] = {"prompt": prompt}
    if isinstance(loras, Path):
        loras = Adapters(loras, base.model)
    lora = _lora(fields["lora"], loras) if fields.get("lora") not in (None, "") else None
    for name, (key, kind) in EXTRA.items():
        if fields.get(name) not in (None, ""):
            settings[key] = _number(name, fields[name], kind)
    if settings.get("refine") and not base.refine:
        raise BadRequest("refine: this server runs no stage-2 refiner; start it with --set refine=true (a model with "
                         "one: Sana-WM)", "refine")  # fmt: skip
    if fields.get("size") not in (None, ""):
        settings["width"], settings["height"] = _size(fields["size"])
    seconds = fields.get("seconds")
    if seconds not in (None, "") and "frames" not in settings:
        value = _number("seconds", seconds, float)
        if not 0 < value <= 600:
            raise BadRequest(f"seconds must be > 0 and at most 600, got {seconds!r}", "seconds")
        settings["frames"] = _frames_for(base, value)
    if image_path is not None:
        try:
            image_class = pipeline_class_name(base.model, image=True)
        except ConfigError as e:
            raise BadRequest(_as_request(str(e)), "input_reference") from e
        # a T2V checkpoint that is I2V too (ModelFamily.image_to_video) runs a job with an image on its image-to-video
        # view (the same modules: setup_with_image_view), which CFG parallelism's guidance pair does not reach
        if image_class != pipeline_class_name(base.model) and base.cfg_parallel:
            raise BadRequest(f"input_reference: {served} runs an image as {image_class}, a view of its "
                             f"{pipeline_class_name(base.model)} that --cfg-parallel does not split; start the server "
                             "without --cfg-parallel to take images", "input_reference")  # fmt: skip
        settings["image"] = image_path
    try:
        config = dataclasses.replace(base, **settings)
        info = check_shape_from_files(config.model, dataclasses.asdict(config))
        check_image_inputs(config, info)
    except (ConfigError, MissingFileError, ValueError) as e:
        raise BadRequest(_as_request(str(e))) from e
    settings.pop("image", None)  # the job keeps its own copy's path
    if lora is not None:
        settings["lora"] = lora
    size = f"{config.width}x{config.height}"
    return config, settings, size, f"{config.frames / config.fps:g}"
