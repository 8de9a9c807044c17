"""Where each built-in tiny model runs whole on sequence-parallel layouts against one process: the evidence behind the
README family table's `code` pipelines ("a built-in tiny model that the tests run whole on sequence-parallel
layouts ..., equal to one process"). ``tests/zoo/test_family_table.py`` checks, without running anything, that every
tiny model of a pipeline the table shows in `code` is here (or is ``SAME_PIPELINE_AS`` one that is), and that each
entry names an existing test function in a test module that names the model (itself or through a tests/support module
it imports) and a layout. Adding a tiny model to a family without a layout run fails that check."""

from __future__ import annotations

_SPLIT = "test_every_layout_gives_the_same_video_from_a_split_sequence"
_EDIT = ("pipelines/test_generate_edit_variants.py", _SPLIT)
_I2V = ("inference/test_image_to_video.py", "test_every_layout_gives_the_one_process_video")
_FAMILIES = ("pipelines/test_generate_families.py", "test_every_layout_gives_the_same_video")
_LTX = ("families/test_ltx_mochi_easyanimate_allegro.py", "test_pipeline_matches_one_process_with_its_sequence_split")
_LTX_VARIANTS = ("pipelines/test_generate_ltx_variants.py", _SPLIT)
_EASY = ("pipelines/test_generate_easyanimate_allegro_hunyuan15_helios.py", _SPLIT)
_INPAINT = (
    "pipelines/test_generate_inpaint_image_transfer.py",
    "test_every_layout_gives_the_same_frames_from_a_split_sequence",
)
_SKYREELS = ("pipelines/test_generate_skyreels_cosmos_motif.py", _SPLIT)
_VARIANTS = ("pipelines/test_generate_wan_hunyuan_variants.py", _SPLIT)
_ANIMATE = ("pipelines/test_generate_animate_latte.py", _SPLIT)
_GENERATE = "test_generate_matches_single_process"

LAYOUT_RUNS: dict[str, tuple[str, str]] = {
    "tiny-wan": ("pipelines/test_generate.py", "test_every_layout_gives_the_same_video"),
    "tiny-wan-i2v": _I2V,
    "tiny-wan-flf2v": _I2V,
    "tiny-wan2.2-a14b": _FAMILIES,
    "tiny-wan2.2-ti2v": _I2V,
    "tiny-wan-v2v": _EDIT,
    "tiny-lucy-edit": _EDIT,
    "tiny-hunyuanvideo": _FAMILIES,
    "tiny-hunyuanvideo-i2v": _I2V,
    "tiny-hunyuanvideo-skyreels-i2v": _EDIT,
    "tiny-cogvideox": _FAMILIES,
    "tiny-cogvideox-i2v": _I2V,
    "tiny-cogvideox-v2v": _EDIT,
    "tiny-cogvideox-fun-control": _EDIT,
    "tiny-ltx": _LTX,
    "tiny-ltx-i2v": _LTX,
    "tiny-ltx-condition": _LTX,
    "tiny-ltx-long": _LTX_VARIANTS,
    "tiny-mochi": _LTX,
    "tiny-ltx2": _LTX,
    "tiny-ltx2-i2v": _EDIT,
    "tiny-ltx2-condition": _EDIT,
    "tiny-ltx2-hdr": _LTX_VARIANTS,
    "tiny-ltx2-in-context": _LTX_VARIANTS,
    "tiny-ltx2-dfr": _LTX_VARIANTS,
    "tiny-ltx2-dfr-refine": (
        "pipelines/test_ltx2_refine.py",
        "test_each_layout_gives_the_one_process_latents_and_frames",
    ),
    "tiny-easyanimate": _EASY,
    "tiny-easyanimate-inpaint": _INPAINT,
    "tiny-allegro": _EASY,
    "tiny-skyreels-v2": _VARIANTS,
    "tiny-skyreels-v2-i2v": _SKYREELS,
    "tiny-skyreels-v2-df": _VARIANTS,
    "tiny-skyreels-v2-df-i2v": _SKYREELS,
    "tiny-skyreels-v2-df-v2v": _SKYREELS,
    "tiny-wan-vace": _VARIANTS,
    "tiny-chronoedit": _VARIANTS,
    "tiny-hunyuanvideo15": _EASY,
    "tiny-hunyuanvideo15-i2v": _EASY,
    "tiny-hunyuanvideo-framepack": _VARIANTS,
    "tiny-anyflow": _VARIANTS,
    "tiny-anyflow-far": ("families/test_anyflow_far.py", "test_generate_gives_one_process_video_from_a_split_sequence"),
    "tiny-kandinsky5": ("families/test_kandinsky_cosmos_helios_minimax.py", "test_pipeline_matches_single_process"),
    "tiny-kandinsky5-i2v": _EDIT,
    "tiny-kandinsky5-t2i": _INPAINT,
    "tiny-kandinsky5-i2i": _INPAINT,
    "tiny-motif-video": _SKYREELS,
    "tiny-motif-video-i2v": _SKYREELS,
    "tiny-cosmos1-t2w": _SKYREELS,
    "tiny-cosmos1-v2w": _EDIT,
    "tiny-cosmos2-v2w": _SKYREELS,
    "tiny-cosmos2-t2i": _EDIT,
    "tiny-cosmos2.5": _SKYREELS,
    "tiny-cosmos2.5-transfer": ("pipelines/test_generate_cosmos_transfer.py", _SPLIT),
    "tiny-minimax-h3": ("pipelines/test_generate_minimax_h3.py", _SPLIT),
    "tiny-helios": _EASY,
    "tiny-helios-pyramid": _EDIT,
    "tiny-latte": _ANIMATE,
    "tiny-wan-animate": _ANIMATE,
    "tiny-sana-video": _I2V,  # and as SanaVideoPipeline: tests/families/test_sana_video.py
    "tiny-sana-video-i2v": ("families/test_sana_video.py", _GENERATE),
    "tiny-cosmos3": ("pipelines/test_generate_cosmos3.py", _SPLIT),
    "tiny-kandinsky6": ("families/test_kandinsky6.py", _GENERATE),
    "tiny-kandinsky6-sr": ("families/test_kandinsky6_sr.py", _GENERATE),
    "tiny-wan-animate-2": ("pipelines/test_generate_wan_animate_2.py", "test_ulysses_2_gives_the_one_process_video"),
    "tiny-sana-wm": ("families/test_sana_wm.py", _GENERATE),
}
"""Built-in tiny model: (its test module under tests/, the test function) of a test that runs its pipeline whole on a
sequence-parallel layout (``generate`` or the pipeline under ``parallelize``) and compares it with one process."""

SAME_PIPELINE_AS: dict[str, str] = {
    "toy-wan": "tiny-wan",  # the trained WanPipeline of the README's quick start
}
"""Built-in models without a layout run of their own, each with a model of the same pipeline class that has one (the
table's claim is per pipeline)."""
