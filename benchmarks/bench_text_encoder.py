"""Per-process peak memory of a text encoder's set-up (load + encode a batch of prompts) at real width and
vocabulary: whole on every process (what each rank loaded before) against sharded over the processes
(``dit_sp.weights.encoder``), in fp32 and bf16, with each row's ratio to the whole encoder on one process.

    python benchmarks/bench_text_encoder.py                  # UMT5-XXL's width and vocabulary, 2 layers
    python benchmarks/bench_text_encoder.py --layers 1 --worlds 1 2 --checkpoint /tmp/umt5  # kept, reused

The checkpoint is UMT5-XXL's shape (256384 x 4096 embedding, 64 heads of 64, ffn 10240) with ``--layers``
blocks and random weights, written tensor by tensor to safetensors (never whole in memory). Peaks are VmHWM
of each worker (the largest over the ranks); glibc returns freed buffers at once (``steady_malloc``). The whole
encoder is copied out of the file ``from_pretrained`` maps, as ``.to("cuda")`` would: on CPU a mapped page that
is never read (most embedding rows) never counts, which would flatter the whole encoder.
"""

from __future__ import annotations

import json
import math
import struct
import tempfile
from pathlib import Path

import torch
from measure import benchmark_parser, peak_rss_mib, steady_malloc  # benchmarks/measure.py

from dit_sp import spawn

UMT5_XXL = {"vocab_size": 256384, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_heads": 64,
            "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
            "feed_forward_proj": "gated-gelu", "is_encoder_decoder": False, "tie_word_embeddings": False}  # fmt: skip
PROMPTS, TOKENS = 2, 128


def write_checkpoint(directory: Path, layers: int) -> int:
    """A random UMT5 encoder of UMT5-XXL's shape saved as ``save_pretrained`` would, one tensor at a time:
    the parameter count."""
    from transformers import UMT5Config, UMT5EncoderModel

    from dit_sp.weights import parameters_on_meta

    config = UMT5Config(num_layers=layers, **UMT5_XXL)
    with parameters_on_meta():
        model = UMT5EncoderModel(config)
    directory.mkdir(parents=True)
    config.architectures = ["UMT5EncoderModel"]
    config.save_pretrained(directory)
    tensors = [(n, p.shape) for n, p in model.named_parameters() if n != "encoder.embed_tokens.weight"]
    header, offset = {}, 0
    for name, shape in tensors:
        size = math.prod(shape) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    generator = torch.Generator().manual_seed(0)
    with open(directory / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for _, shape in tensors:
            flat = math.prod(shape)
            for start in range(0, flat, 1 << 24):  # 64 MB at a time
                chunk = torch.randn(min(1 << 24, flat - start), generator=generator) * 0.02
                f.write(chunk.numpy().tobytes())
    return sum(math.prod(shape) for _, shape in tensors)


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    header.pop("__metadata__", None)
    return header


def token_ids() -> torch.Tensor:
    return torch.randint(0, UMT5_XXL["vocab_size"], (PROMPTS, TOKENS), generator=torch.Generator().manual_seed(1))


def setup_worker(directory: str, mode: str, dtype: str) -> dict[str, float]:
    """Load the encoder (``whole``: ``from_pretrained`` on this process; ``sharded``: over the world) and
    encode; the peak RSS and the embeddings of the first prompt."""
    import torch.distributed as dist

    from dit_sp.weights.encoder import load_sharded_text_encoder

    steady_malloc()
    if mode == "whole":
        from transformers import UMT5EncoderModel

        encoder = UMT5EncoderModel.from_pretrained(directory, dtype=getattr(torch, dtype)).eval()
        for param in encoder.parameters():  # what a GPU holds after .to("cuda"): on CPU the file is only mapped,
            param.data = param.data.clone()  # and the pages never touched (most embedding rows) never count
    else:
        dist.init_process_group("gloo")
        encoder = load_sharded_text_encoder(directory, dist.group.WORLD, "cpu", getattr(torch, dtype))
    with torch.no_grad():
        out = encoder(input_ids=token_ids()).last_hidden_state
    return {"peak": peak_rss_mib(), "first": out[0].float().clone()}


def main() -> None:
    parser = benchmark_parser(__doc__, layers=2)
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runs", nargs="+", default=["whole:float32", "sharded:float32", "sharded:bfloat16"],
                        help="encoder:dtype pairs to measure (whole:float32 is the ratios' base)")  # fmt: skip
    parser.add_argument("--checkpoint", type=Path, help="the checkpoint directory: written there if it does not "
                        "exist, else reused (default: a temporary one)")  # fmt: skip
    args = parser.parse_args()
    rows, outputs = [], {}
    with tempfile.TemporaryDirectory(prefix="bench_text_encoder_") as tmp:
        path = args.checkpoint or Path(tmp) / "umt5"
        if path.exists():
            config = json.loads((path / "config.json").read_text())
            params = sum(info["data_offsets"][1] - info["data_offsets"][0]
                         for info in _header(path / "model.safetensors").values()) // 4  # fmt: skip
            args.layers = config["num_layers"]
        else:
            params = write_checkpoint(path, args.layers)
        print(f"UMT5-XXL shape, {args.layers} layers: {params / 1e9:.2f} B parameters ({params * 4 / 2**30:.1f} GiB "
              f"in fp32), {PROMPTS} prompts of {TOKENS} tokens", flush=True)  # fmt: skip
        for mode, dtype in (run.split(":") for run in args.runs):
            for world in args.worlds:
                results = spawn(setup_worker, world, args=(str(path), mode, dtype), timeout=3600)
                rows.append((mode, dtype, world, max(r["peak"] for r in results)))
                outputs[(mode, dtype, world)] = results[0]["first"]
                print(f"  {mode} {dtype} on {world}: {rows[-1][3]:.0f} MiB", flush=True)
    base = next((peak for mode, dtype, world, peak in rows if (mode, dtype, world) == ("whole", "float32", 1)), None)
    base = base or rows[0][3]
    print(
        "\nper-process peak RSS of set-up (load + encode), MiB; ratio to the whole fp32 encoder on 1 process "
        "(else to the first row)"
    )
    print(f"{'encoder':>10} {'dtype':>9} {'processes':>10} {'peak MiB':>10} {'ratio':>7}")
    for mode, dtype, world, peak in rows:
        print(f"{mode:>10} {dtype:>9} {world:>10} {peak:>10.0f} {peak / base:>6.2f}x")
    reference = outputs.get(("whole", "float32", 1), next(iter(outputs.values())))
    for key, out in outputs.items():
        error = ((out - reference).abs().max() / reference.abs().max()).item()
        print(f"{' '.join(map(str, key))}: max |difference| to the whole fp32 encoder / max |value| = {error:.2e}")


if __name__ == "__main__":
    main()
