"""Text-to-video checkpoints that are image-to-video models too (``ModelFamily.image_to_video``): each declared pair's
tiny text-to-video model runs with an image as the declared class, from its files and built, of the very same modules
and pipeline settings; a checkpoint its image class cannot take (missing a component it needs) and a class whose
predicate does not hold (Wan 2.1 T2V) are not switched."""

from __future__ import annotations

import pytest

from dit_sp.errors import ConfigError
from dit_sp.families import FAMILIES
from dit_sp.zoo import as_image_to_video, build_tiny, model_spec, pipeline_class_name

PAIRS = {(source, target) for family in FAMILIES for source, target in family.image_to_video.items()}
TINY = {model_spec(name)["pipeline"]: name for family in FAMILIES for name in family.tiny_models
        if "pipeline" in model_spec(name) and not model_spec(name).get("pipeline_config")}  # fmt: skip
REFUSED = {"MotifVideoPipeline": "feature_extractor"}  # its tiny model has no SigLIP processor


def test_the_declared_pairs_are_the_families_checked_ones():
    assert {source for source, _ in PAIRS} == {"SanaVideoPipeline", "WanPipeline", "LTXPipeline", "LTX2Pipeline",
                                               "SkyReelsV2DiffusionForcingPipeline", "MotifVideoPipeline"}  # fmt: skip


@pytest.mark.parametrize(("source", "target"), sorted(PAIRS))
def test_a_text_to_video_model_runs_as_its_image_to_video_class(source, target):
    model = "tiny-wan2.2-ti2v" if source == "WanPipeline" else TINY[source]
    pipe = build_tiny(model)
    if source in REFUSED:
        for call in (lambda: pipeline_class_name(model, image=True), lambda: as_image_to_video(pipe)):
            why = rf"cannot run with an image: .* needs the component\(s\) {REFUSED[source]}, which this {source}"
            with pytest.raises(ConfigError, match=why):
                call()
        return
    assert pipeline_class_name(model) == source and pipeline_class_name(model, image=True) == target
    converted = as_image_to_video(pipe)
    assert type(converted).__name__ == target
    assert all(converted.components[name] is module for name, module in pipe.components.items())
    settings = {k: v for k, v in pipe.config.items() if not k.startswith("_") and k not in pipe.components}
    assert {k: converted.config[k] for k in settings} == settings  # Wan 2.2 TI2V: expand_timesteps, boundary_ratio


def test_wan_2_1_text_to_video_is_not_switched():
    pipe = build_tiny("tiny-wan")
    assert pipeline_class_name("tiny-wan", image=True) == "WanPipeline" and as_image_to_video(pipe) is pipe


def test_a_setting_the_image_class_does_not_take_is_refused(tmp_path):
    import json

    build_tiny("tiny-sana-video").save_pretrained(tmp_path / "sana")
    index = tmp_path / "sana" / "model_index.json"
    index.write_text(json.dumps(json.loads(index.read_text()) | {"motion_score": 30}))  # no parameter for it
    why = r"\(SanaVideoPipeline\) cannot run with an image: .* SanaImageToVideoPipeline takes no motion_score, which"
    with pytest.raises(ConfigError, match=why):
        pipeline_class_name(tmp_path / "sana", image=True)
