"""The inputs of an inpainting pipeline (EasyAnimate's ``EasyAnimateInpaintPipeline``): a video to keep parts of and
its mask, as the tensors the pipeline takes, ``video`` ``(1, 3, F, H, W)`` in [0, 1] and ``mask_video``
``(1, 1, F, H, W)``, 255 where a pixel is made anew and 0 where it is kept. From ``--image`` (image-to-video: the
image is the kept first frame, the others are made, as diffusers' ``get_image_to_video_latent`` builds it), from
``--video`` with ``--mask-video`` (per frame, white: made anew, black: kept), or from neither (text-to-video: every
frame made)."""

from __future__ import annotations

from typing import Any


def takes_inpaint(takes: Any) -> bool:
    """Whether a pipeline whose ``__call__`` parameters are ``takes`` inpaints a video under a mask (EasyAnimate's
    inpaint pipeline), not Wan Animate's replace mode (which takes a mask video too, with its pose video)."""
    return "mask_video" in takes and "video" in takes and "pose_video" not in takes


def inpaint_inputs(images: dict[str, Any], frames: int, height: int, width: int) -> dict[str, Any]:
    """``{"video", "mask_video"}`` tensors (see the module) from the images read for the call: ``video`` and
    ``mask_video`` (PIL frames; their first ``frames`` taken), else ``image`` (PIL) or nothing."""
    import torch

    if "video" in images:
        video = frames_tensor(images["video"][:frames], height, width)
        mask = frames_tensor([m.convert("L") for m in images["mask_video"][:frames]], height, width)
        return {"video": video, "mask_video": (mask > 0.5).to(torch.float32) * 255}
    from diffusers.pipelines.easyanimate.pipeline_easyanimate_inpaint import get_image_to_video_latent

    start = [images["image"]] if "image" in images else None
    video, mask = get_image_to_video_latent(start, None, frames, (height, width))
    return {"video": video, "mask_video": mask}


def frames_tensor(frames: list[Any], height: int, width: int) -> Any:
    """PIL frames resized to ``height`` x ``width`` as ``(1, C, F, H, W)`` in [0, 1] (C: 3 for RGB, 1 for L)."""
    import numpy as np
    import torch

    pixels = np.stack([np.asarray(f.resize((width, height)), dtype=np.float32) / 255 for f in frames])  # (F, H, W[, C])
    tensor = torch.from_numpy(pixels if pixels.ndim == 4 else pixels[..., None])
    return tensor.permute(3, 0, 1, 2)[None].contiguous()
