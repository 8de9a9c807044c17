"""What ``generate`` holds while it denoises, with its text encoder kept against freed once the prompts are
encoded (``free_text_encoders``), and what the embedding cache saves on a batch whose prompts repeat.

    python benchmarks/bench_encoder_lifetime.py                 # a UMT5 encoder of 2048 x 256k vocabulary
    python benchmarks/bench_encoder_lifetime.py --width 4096    # UMT5-XXL's width (about 4.6 GiB in fp32)

The pipeline is tiny-wan with a random one-layer UMT5 encoder of real vocabulary (its token embedding is
most of UMT5-XXL's bytes) and ``--width``, in fp32, on one process. "while denoising" is the largest resident
set (VmRSS) seen at the end of a denoising step; "peak" is VmHWM (the set-up, when the encoder is loaded
beside the transformer, sets it in both). The encoder is copied out of the file ``from_pretrained`` maps, as
``.to("cuda")`` would. glibc returns freed buffers at once (``steady_malloc``).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from measure import benchmark_parser, peak_rss_mib, rss_mib, steady_malloc, tiny_wan_pipeline

from dit_sp import GenerateConfig, spawn

VOCAB, PROMPTS = 256384, ["a red circle moving left", "a blue square moving up", "a green triangle moving right"]


def write_pipeline(directory: Path, width: int) -> None:
    """tiny-wan with a random one-layer UMT5 encoder of ``width`` and UMT5's vocabulary, saved."""
    from transformers import UMT5Config, UMT5EncoderModel

    pipe = tiny_wan_pipeline(layers=2, heads=2, text_dim=width)
    config = UMT5Config(vocab_size=VOCAB, d_model=width, d_kv=64, d_ff=width * 5 // 2, num_heads=width // 64,
                        num_layers=1, feed_forward_proj="gated-gelu", is_encoder_decoder=False)  # fmt: skip
    torch.manual_seed(0)
    pipe.register_modules(text_encoder=UMT5EncoderModel(config))
    pipe.save_pretrained(directory)


def one_video(directory: str, free: bool) -> dict[str, float]:
    """Peak RSS and the resident set while denoising of one video, MiB."""
    from dit_sp.inference.encoders import TextEncoders
    from dit_sp.inference.session import sample, setup

    steady_malloc()
    config = GenerateConfig(model=directory, steps=4, frames=5, height=32, width=32, out="/dev/null")
    parallel, pipe, guidance, _ = setup(config, images=False)
    for param in pipe.text_encoder.parameters():  # copied out of the mapped file, as .to("cuda") would: on CPU
        param.data = param.data.clone()  # a mapped page never read (most embedding rows) would never count
    encoders = TextEncoders(pipe, int(config.embedding_cache_mb * 2**20))
    if free:
        encoders.free_in_first_step()
    denoising: list[float] = []
    sample(pipe, config, guidance, 0, parallel.device, on_step=lambda done, total: denoising.append(rss_mib()))
    return {"peak": peak_rss_mib(), "denoising": max(denoising)}


def batch(directory: str, cache_mb: float, out: str) -> dict[str, float]:
    """Seconds and encoder runs of a batch of 9 videos over 3 prompts."""
    from dit_sp import generate

    prompts = Path(out) / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS * 3) + "\n")
    config = GenerateConfig(model=directory, steps=2, frames=5, height=32, width=32, prompts=str(prompts),
                            out=str(Path(out) / f"cache{cache_mb}" / "v.mp4"), embedding_cache_mb=cache_mb)  # fmt: skip
    start = time.perf_counter()
    report = generate(config)
    return {"seconds": time.perf_counter() - start, **report["text_encoders"]}


def main() -> None:
    parser = benchmark_parser(__doc__, width=2048)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_encoder_lifetime_") as tmp:
        directory = str(Path(tmp) / "pipe")
        write_pipeline(Path(directory), args.width)
        encoder_gib = (VOCAB * args.width + 1.5 * 4 * args.width**2) * 4 / 2**30
        print(f"tiny-wan with a one-layer UMT5 of {args.width} x {VOCAB} (about {encoder_gib:.1f} GiB in fp32)")
        rows = {free: spawn(one_video, 1, args=(directory, free), timeout=3600)[0] for free in (False, True)}
        print(f"\n{'text encoder':>24} {'peak MiB':>9} {'while denoising MiB':>20}")
        for free, row in rows.items():
            name = "freed after encoding" if free else "kept (before)"
            print(f"{name:>24} {row['peak']:>9.0f} {row['denoising']:>20.0f}")
        print(f"while denoising: {rows[True]['denoising'] / rows[False]['denoising']:.2f}x of kept")
        runs = {mb: spawn(batch, 1, args=(directory, mb, tmp), timeout=3600)[0] for mb in (0.0, 512.0)}
        print(f"\n9 videos over 3 prompts (and the empty negative prompt)\n{'embedding cache':>16} "
              f"{'encoder runs':>13} {'reused':>7} {'seconds':>8}")  # fmt: skip
        for mb, run in runs.items():
            print(f"{'off' if not mb else f'{mb:.0f} MiB':>16} {run['encoded']:>13} {run['reused']:>7} "
                  f"{run['seconds']:>8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
