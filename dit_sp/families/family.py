"""What dit-sp needs to know about one diffusers transformer family."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from dit_sp._compat import block_argument
from dit_sp.vae import VAEPlan

if TYPE_CHECKING:
    import torch

    from dit_sp.parallel.state import ParallelState

Plan = dict[str, Any]
"""Where a transformer's sequence is split and gathered: a diffusers ``_cp_plan`` (``dit_sp.sp.plan``)."""

TRANSFORMERS = ("transformer", "transformer_2")
"""The pipeline components that hold a DiT (Wan 2.2 A14B has two experts)."""

PARALLELIZED_TRANSFORMERS = (*TRANSFORMERS, "transformer_ref")
"""The components ``parallelize`` makes sequence-parallel: also MiniMax-H3's reference-to-video partition (its
modular pipeline holds both)."""

SETTINGS = ("frames", "height", "width", "steps", "guidance", "max_sequence_length")
"""The generation settings of ``ModelFamily.checkpoint_defaults``, in the order ``generation_defaults`` takes them."""


class Undo:
    """A removable handle (what ``ModelFamily.hooks`` returns) around an undo function: ``remove()`` calls it."""

    def __init__(self, undo: Callable[[], object]):
        self.remove = undo


def generation_defaults(*values: Any) -> dict[str, Any]:
    """``{frames, height, width, steps, guidance, max_sequence_length}`` of the values in that order."""
    return dict(zip(SETTINGS, values, strict=True))


def timestep_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """A ``teacache_probe``: the timestep modulation the blocks get (their ``temb`` argument), as TeaCache measures
    Wan: per sample (``(B, C)``, Wan's ``(B, 6, C)``), or per token, ``(B, S, 6, C)`` (Wan 2.2 TI2V, Helios)."""
    temb = block_argument(meta, "temb", args, kwargs)
    return temb, temb.dim() == 4


def no_grad(fn: Callable) -> Callable:
    """``torch.no_grad()`` as a decorator that imports torch only when ``fn`` runs (the registry is read
    without it: ``--help``, the memory planner)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper


@dataclass(frozen=True)
class BranchCalls:
    """How a step cache names the guidance branch of a transformer call that the family's pipelines make once per
    branch outside diffusers' cache contexts (``ModelFamily.cache_branches``; the rule: ``dit_sp.cache.contexts``)."""

    prompt: str | None = "encoder_hidden_states"
    """The forward argument holding the branch's prompt embeddings: the pipeline passes one tensor per branch for the
    whole run, the conditional one first, so a run's first tensor names ``cond`` and its second ``uncond``. None: the
    pipeline does not guide (one call a step: Kandinsky 6 SR, MiniMax-H3), every call is ``cond``, and a call none of
    whose timesteps moved on from the previous call's (below it; above it where they rise) starts a new schedule (a
    tile's, a run's)."""
    timestep: str = "timestep"
    """The forward argument holding the step's timestep: a call whose timestep is above the previous call's starts a
    new schedule (Framepack's next section), and every branch's cache state is reset first."""
    rising: bool = False
    """Whether the timesteps the transformer gets rise over a schedule (MiniMax-H3's flow time: 0 noise, 1 data;
    Mochi's inverted timesteps) rather than fall: a new schedule then starts with a call whose timesteps are below the
    previous call's (none above), for calls outside cache contexts and inside the pipeline's own alike. Declared the
    wrong way, every call looks like a new schedule: nothing is skipped, nothing is wrong."""


VAEFactors = Callable[[dict[str, Any]], tuple[int, int]]
"""A pipeline class's ``(temporal, spatial)`` VAE compression, from the VAE's config."""


@dataclass(frozen=True)
class ModelFamily:
    name: str
    class_names: tuple[str, ...]
    """diffusers transformer classes of the family."""
    plan: Callable[[torch.nn.Module], Plan]
    """Where the sequence is split and gathered (a diffusers ``_cp_plan``)."""
    attention_modules: tuple[str, ...]
    """``fnmatch`` patterns of the attention modules over the whole (split) video sequence."""
    hooks: Callable[[torch.nn.Module, Any], list[Any]] | None = None
    """Hooks beyond the plan, for what a ``_cp_plan`` cannot say (Helios: a global token count its blocks take, made
    this rank's; a gather of a module's input), from the model and its ``dit_sp.sp.context.SequenceContext``;
    returns their removable handles. Installed after the plan's hooks, so they run after them."""
    gathered_key_modules: tuple[str, ...] = ()
    """``fnmatch`` patterns of attention modules whose queries are whole on every rank and whose keys and values
    are the split video (LTX-2's video-to-audio attention): the keys and values are gathered."""
    stream_modules: Callable[[torch.nn.Module], dict[str, int]] = lambda model: {}
    """Attention modules (of ``attention_modules``, by name) whose tokens are several sequences split like the video,
    side by side on each rank, with no joint tokens, from the model: how many (Motif-Video's decoder layers, whose
    second stream is the encoder's video, 2). Their attention is ``usp_attention``'s ``streams``."""
    joint_position: Literal["front", "rear"] = "front"
    """Where the processors put text tokens when they attend jointly with the video."""
    cfg_mode: Literal["sequential", "batched"] = "sequential"
    """How the family's stock pipeline runs guidance: two transformer calls per step (conditional
    first), or one call on a batch of ``[unconditional, conditional]``."""
    channels_last: bool = False
    """Whether the transformer takes and returns latents ``(B, F, H, W, C)`` (Kandinsky 5) rather than
    ``(B, C, F, H, W)``."""
    cfg_refused: str = ""
    """Why CFG parallelism cannot run the family's pipelines (empty: it can); ``parallelize`` refuses ``cfg=2``
    with this reason."""
    cfg_extra_outputs: Callable[[torch.nn.Module, dict[str, Any]], tuple[tuple[int, ...], ...]] | None = None
    """``sequential`` mode: the shapes of the outputs after the first that a call returns (Kandinsky 6's audio
    velocity), from the model and the call's arguments by name; none: one output is exchanged."""
    ring_refused: str = ""
    """Why a ring cannot split the family's attention exactly (empty: it can): one that only Ulysses splits, run on
    the whole sequence of each rank's heads by ``attend_whole_sequence`` (AnyFlow FAR's and Wan-Animate-2's block masks
    and KV caches, Kandinsky 6 SR's NABLA sparse attention, Sana-WM's gated-delta-rule scans); ``parallelize`` refuses
    ``ring > 1`` with it (``LayoutRefused``), ``generate`` and the memory planner before loading, and the family table
    shows "ulysses (ring refused)"."""
    ring_refused_by: Callable[[Any], str] = lambda config: ""
    """Why a ring cannot split exactly a transformer of the family with this config (its ``config.json`` mapping),
    where only some of its checkpoints refuse one (Kandinsky 5's NABLA ones); empty: it can. Read, as
    ``ring_refused``, by ``parallelize`` and, from the checkpoint's files, before loading (``ring_refusal``)."""
    cfg_batched_args: tuple[str, ...] = ()
    """Forward arguments that carry the guidance batch (``batched`` mode)."""
    guidance_arg: str = "guidance_scale"
    """The pipeline argument whose value > 1 turns classifier-free guidance on; ``"guider"``: none, the scale of the
    pipeline's ``ClassifierFreeGuidance`` guider component does (HunyuanVideo-1.5)."""
    guidance_needs_any: tuple[str, ...] = ()
    """Pipeline arguments of which one must also be given for guidance to run (e.g. a negative prompt)."""
    check: Callable[[torch.nn.Module], None] = lambda model: None
    """Raises for configurations of the family that are not supported (at ``parallelize`` and at every call: a
    pipeline may reconfigure its model per call)."""
    layout_check: Callable[[torch.nn.Module, ParallelState], None] = lambda model, parallel: None
    """Raises for configurations of the family that split exactly on some layouts only (SkyReels-V2's block-causal
    frames: Ulysses alone); called with ``check``."""
    prepare_pipeline: Callable[[Any], None] = lambda pipe: None
    """Readies a loaded pipeline of the family for this install, on one process too (Cosmos: a torch-only stand-in
    for torchvision's resize, where torchvision is missing); ``dit_sp.zoo``'s loading and ``parallelize`` call it."""
    pipelines: tuple[str, ...] = ()
    """diffusers pipeline classes that GRPO can train (through ``policy``)."""
    policy: type | None = None
    """The GRPO policy class (a ``dit_sp.families.policy.DiffusersPolicy``) of those pipelines."""
    policy_refused: dict[str, str] = field(default_factory=dict, hash=False)
    """Pipeline classes of the family that GRPO does not train, each with its one-line reason (a sampler no
    single-velocity policy reproduces: Helios's chunk-by-chunk generation); ``policy_for`` raises it."""
    vae: VAEPlan | None = None
    """How the family's VAE decodes and encodes with its rows split (``dit_sp.vae``)."""
    teacache_probe: Callable[[torch.nn.Module, object, tuple, dict], tuple[torch.Tensor, bool]] | None = None
    """What the ``teacache`` step cache compares between steps, from the first block and its call
    ``(block, metadata, args, kwargs)``: ``(tensor, per_token)``, per-token tensors laid out
    ``(B, S_local, ...)`` (``(S_local, ...)`` where ``cache_token_dim`` is 0; ``dit_sp.cache.teacache``)."""
    shape_check: Callable[[Any, dict[str, Any], Callable[[str], str], tuple[int, int]], None] = (
        lambda config, settings, name, vae: None
    )
    """Raises for generation settings the family's positional embeddings cannot take (rotary tables, fixed
    embedding sizes), from the transformer's config, the settings, how to name a setting in the message and
    the VAE's ``(temporal, spatial)`` compression (``dit_sp.families.check_shape``); one line naming the limit
    and the largest (or only) value allowed."""
    tiny_models: tuple[str, ...] = ()
    """The family's built-in models (``dit_sp/zoo/specs/<name>.yaml``)."""
    checkpoint_defaults: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False)
    """Generation defaults of a local checkpoint, by its diffusers pipeline class: the real models' settings."""
    vae_factors: dict[str, VAEFactors] = field(default_factory=dict, hash=False)
    """How each of the family's pipeline classes derives its VAE's compression from the VAE config."""
    modular_pipelines: tuple[str, ...] = ()
    """Modular Diffusers pipelines (``ModularPipeline`` blocks) whose transformer the family parallelizes; the
    classic pipeline classes are read from diffusers itself (``dit_sp.families.table``)."""
    refused: dict[str, str] = field(default_factory=dict, hash=False)
    """Transformer classes of the family that ``parallelize`` refuses, each with its one-line reason (``check``
    raises it)."""
    refused_pipelines: dict[str, str] = field(default_factory=dict, hash=False)
    """Pipeline classes of the family that ``parallelize`` and ``generate`` refuse, each with its one-line reason
    (a stock pipeline that fails on one process too: nothing to match)."""
    modular_inputs: dict[str, str] = field(default_factory=dict, hash=False)
    """``generate``'s call arguments the family's modular pipelines' blocks take, each under its blocks' name
    (Wan-Animate-2: ``image`` as it is; ``video``, the ``--video`` frames, as ``driving_video``; ``num_frames``,
    ``--frames``, as ``segment_frame_length``). The input flags named here go to the blocks (required where the blocks
    require them); the others are refused before loading."""
    modular_workflow: str = ""
    """The workflow of the family's modular blocks that ``generate`` runs (MiniMax-H3's text-to-video-and-audio
    ``t2va``), where the blocks have several: only its components load from a repository (``dit_sp.zoo.modular``);
    empty: every component the blocks expect."""
    modular_workflows: dict[str, str] = field(default_factory=dict, hash=False)
    """Other workflows of the family's modular blocks that ``generate`` runs, each by the ``generate`` setting that
    selects it, the first given winning (MiniMax-H3: ``last_image`` runs ``fl2va``, else ``image``, a reference image,
    ``ref2va``); ``workflow_for`` reads it, and ``GenerateConfig.workflow`` names one instead."""
    workflow_inputs: dict[str, dict[str, str]] = field(default_factory=dict, hash=False)
    """Per workflow of ``modular_workflows`` (or ``modular_workflow``), the inputs it takes in place of
    ``modular_inputs`` (MiniMax-H3's ``fl2va``: ``image`` as its first frame and ``last_image`` as its last, under their
    own names; ``t2va``: none); ``inputs_for`` reads it."""
    modular_unused: tuple[str, ...] = ()
    """Components of the family's modular blocks that ``generate`` never runs, neither required in nor loaded from a
    repository (LTX-2.5's ``prompt_enhancer`` and its ``processor``: no prompt enhancement; its ``duration_head``:
    ``generate`` always passes the frame count)."""
    modular_arguments: Callable[[dict[str, Any]], dict[str, Any]] = lambda arguments: arguments
    """``generate``'s call arguments, under the blocks' names, as the blocks take them (MiniMax-H3: its ``references``
    image as the list of one ``MiniMaxH3ImageReference`` its ``ref2va`` blocks take)."""
    modular_fixed: dict[str, dict[str, str]] = field(default_factory=dict, hash=False)
    """Per modular pipeline, the ``generate`` settings its blocks fix at the repository's defaults
    (``dit_sp.zoo.model_defaults``: Echo's ``steps``, its 8 sigmas), each with why: another value would be ignored, or
    fail in diffusers after loading, so ``generate`` refuses it before loading (``dit_sp.zoo.modular.check_fixed``)."""
    refiners: dict[str, str] = field(default_factory=dict, hash=False)
    """Pipeline classes of the family whose output a second pipeline refines (``generate --refine``), each with that
    refiner's class (Sana-WM's stage 2, ``SanaWMLTX2Refiner``: loaded by ``dit_sp.zoo.refiner``)."""
    python_only: dict[str, str] = field(default_factory=dict, hash=False)
    """Pipeline classes of the family that ``parallelize`` splits but ``generate`` does not run (they take another
    pass's output, which a CLI run does not chain), each with its one-line reason: called from Python."""
    controlnet: ModelFamily | None = None
    """How ``parallelize`` splits a pipeline's ``controlnet`` component of the family (Cosmos-Transfer2.5's
    ``CosmosControlNetModel``): its class names, plan and attention modules; its outputs are gathered whole for the
    transformer's plan to split where the blocks take them. None: a ControlNet runs whole on every rank."""
    frames_used: tuple[str, ...] = ()
    """Pipeline classes of the family whose own code computes with the decoded frames (LTX's long multi-prompt
    pipeline blends its decoded tiles): ``parallelize`` assembles their split VAE's frames on every rank, even
    with ``frames_on="leader"``."""
    video_prefix: tuple[str, ...] = ()
    """Pipeline classes of the family that keep ``--video``'s latent frames as the first of the video they make
    (``AnyFlowPipeline``'s ``video``): ``generate`` refuses, before loading, a video of more latent frames than
    ``--frames`` makes (the pipeline would fail on a tensor size)."""
    video_tensor: dict[str, Callable[[dict[str, Any], int], tuple[tuple[int, ...], str]]] = field(
        default_factory=dict, hash=False
    )
    """Pipeline classes of the family that take ``--video`` as one ``(1, T, 3, H, W)`` tensor in [0, 1], not a list
    of frames (``AnyFlowFARPipeline``'s ``video``), each with the lengths ``T`` it takes, from its transformer's
    config and its VAE's temporal factor, and why those: ``generate`` passes the frames so, and refuses a video of
    another length before loading."""
    step_cache_refused: str = ""
    """Why the step caches cannot run exactly on the family's blocks (empty: they can: diffusers has block metadata for
    them, or ``block_outputs`` gives it, and what runs between blocks is nothing the hooks would skip wrongly, or
    declared: ``cache_between_blocks``, ``cache_layout``);
    ``enable_cache`` and ``generate --cache`` (before loading) refuse with it, the family table shows "refused", and
    ``tests/zoo/test_family_table.py`` checks it against the tiny models."""
    compile_note: str = ""
    """Where and why regional compile (``dit_sp.sp.compile``) breaks the graph of the family's blocks under sequence
    parallelism, as measured (Dynamo's reason and its cause: a stock processor's data-dependent shape, a collective
    outside dit-sp's attention op); empty: the blocks compile without a graph break on Ulysses and on a ring. The
    family table's compile column shows it; tests/families/test_compile_families.py checks it both ways."""
    cache_refused_args: dict[str, str] = field(default_factory=dict, hash=False)
    """Transformer arguments a step-cached call must not carry (None or absent), each with why: what the model adds
    between its blocks from them lies outside what diffusers' cache hooks skip, so a skipped step would add it on top
    of a cached residual that already holds it (Sana-Video's ``controlnet_block_samples``). A cached call that passes
    one is refused in one line (``dit_sp.cache.contexts``); calls without them are cached as usual."""
    cache_between_blocks: tuple[str, ...] = ()
    """The model's modules (attribute names: a module or a ``ModuleList``) that run between its blocks and whose output
    the model adds to the hidden states, each taking them as ``hidden_states`` (Wan Animate's ``face_adapter``). Under
    a step cache, a skipped step's cached residual already holds what those between the first and the last block added,
    so there they return zeros; elsewhere, and on computed steps, they run (``dit_sp.cache.between``)."""
    cache_layout: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    """Where the model's last block lays the hidden states out otherwise than its first (Latte: a temporal block's
    ``(B S, F, C)``, a spatial block's ``(B F, S, C)``): ``(x, like)`` gives ``x`` in ``like``'s layout, either way.
    A step cache then keeps its residual in the first block's layout, and on a skipped step the last block returns
    what the first block returned, in its own layout (``dit_sp.cache.between``)."""
    cache_token_dim: int = 1
    """The dimension of the tokens in the blocks' hidden states, and in a per-token ``teacache_probe``: 1 for
    ``(B, S, ...)``; 0 for one packed sequence without a batch dimension (Cosmos 3's layers take ``(S, C)``). A step
    cache decides from the real tokens along it (the last shard's padding left out: ``dit_sp.cache.decide``)."""
    cache_branches: BranchCalls | None = None
    """For a ``sequential`` family whose pipelines call the transformer per guidance branch outside diffusers' cache
    contexts (ChronoEdit, HunyuanVideo Framepack): how a step cache names each call's branch. None: such a call is
    refused under a step cache (one state would serve both branches). Any family: its ``timestep`` and ``rising``
    tell a step cache where a new schedule starts (a ``batched`` family's, Mochi's, only those)."""
    block_outputs: dict[str, tuple[Any, ...]] = field(default_factory=dict, hash=False)
    """Blocks diffusers has no metadata for, by class name: where their outputs are (the hidden states' index, the
    encoder hidden states' index or None; ``(0, None)`` for a block returning one tensor), optionally followed by the
    names of the arguments taking those two streams where they are not ``hidden_states`` / ``encoder_hidden_states``
    (LTX-2's second stream, its audio: ``(0, 1, "hidden_states", "audio_hidden_states")``). A step cache registers
    them with diffusers' block registry when it is enabled on the family's model, so that diffusers' hooks read them."""
    image_to_video: dict[str, str] = field(default_factory=dict, hash=False)
    """Text-to-video pipeline classes of the family whose checkpoints are also image-to-video models, each with the
    image-to-video pipeline class that runs them when an image is given (SANA-Video 2B's ``SanaVideoPipeline`` as
    ``SanaImageToVideoPipeline``): the same components and weights, checked against that class's ``__init__``
    (``dit_sp.zoo.image``), so that no checkpoint's ``_class_name`` is edited by hand. Where only some checkpoints
    of a class are, ``image_to_video_if`` says which."""
    image_to_video_if: Callable[[dict[str, Any]], bool] = lambda config: True
    """Whether a checkpoint of an ``image_to_video`` class is one, from its pipeline's config (``model_index.json``'s
    settings, a built pipeline's ``config``): Wan's ``WanPipeline`` only with per-token timesteps (Wan 2.2 TI2V's
    ``expand_timesteps``); Wan 2.1 T2V was not trained on images."""
    last_image_refused: Callable[[dict[str, Any]], str] = lambda config: ""
    """Why a checkpoint of the family, from its pipeline's settings, ignores the ``last_image`` its pipeline class
    takes (a clause; empty where it uses it): Wan 2.2 TI2V (``expand_timesteps``) encodes the first frame only."""
    architectures: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False)
    """The real checkpoints, for the memory planner (``dit_sp.memory.planner.ARCHITECTURES``): their
    transformer configs, text-encoder and VAE parameter counts, VAE compression and text length."""

    @property
    def step_cache(self) -> bool:
        """Whether the step caches run on the family's blocks (``step_cache_refused`` is empty)."""
        return not self.step_cache_refused

    def workflow_for(self, settings: dict[str, Any]) -> str:
        """The workflow of the family's modular blocks that ``generate`` runs with ``settings`` (a ``GenerateConfig``
        as a mapping): the one its ``workflow`` names, else the first of ``modular_workflows`` whose setting is given,
        else ``modular_workflow``."""
        if settings.get("workflow"):
            return settings["workflow"]
        return next((flow for key, flow in self.modular_workflows.items() if settings.get(key)), self.modular_workflow)

    @property
    def workflows(self) -> tuple[str, ...]:
        """Every workflow ``generate`` runs the family's modular blocks in (empty: the blocks have one)."""
        flows = [self.modular_workflow, *self.modular_workflows.values()] if self.modular_workflows else []
        return tuple(dict.fromkeys(flows))

    def inputs_for(self, workflow: str) -> dict[str, str]:
        """``generate``'s inputs that ``workflow`` takes, each with its blocks' name for it: its ``workflow_inputs``,
        else ``modular_inputs``."""
        return self.workflow_inputs.get(workflow, self.modular_inputs)

    def ring_refusal(self, config: Any) -> str:
        """Why a ring cannot split the family's transformer of ``config`` (a ``config.json`` mapping) exactly:
        ``ring_refused``, else ``ring_refused_by(config)``; empty where a ring splits it."""
        return self.ring_refused or self.ring_refused_by(config)
