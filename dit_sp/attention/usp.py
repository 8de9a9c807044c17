"""USP: Ulysses all-to-all inside, ring attention across, for non-causal (DiT) attention."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F

from dit_sp.attention import ulysses
from dit_sp.attention.kernels import get_kernel
from dit_sp.attention.ring import RingSpec, ring_attention
from dit_sp.parallel.comm import true_length
from dit_sp.parallel.state import ParallelState

Tensor = torch.Tensor
JointPosition = Literal["front", "rear"]


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, joint_len: int, joint_position: str, streams: int = 1) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "usp_attention expects q, k, v in layout (B, S_local, H, D); got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.shape == k.shape and k.shape[:3] == v.shape[:3]):
        raise ValueError(
            "usp_attention is self-attention: q and k must have the same shape (B, S_local, H, D) and v the "
            f"same (B, S_local, H); got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}. "
            "For cross-attention to replicated text, call plain attention on the local queries: it needs no "
            "communication."
        )
    if v.shape[-1] != q.shape[-1]:
        raise ValueError(f"v head size {v.shape[-1]} differs from q/k head size {q.shape[-1]}; not supported")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if joint_position not in ("front", "rear"):
        raise ValueError(f"joint_position must be 'front' or 'rear', got {joint_position!r}")
    if not 0 <= joint_len <= q.shape[1]:
        raise ValueError(f"joint_len={joint_len} must be between 0 and the local sequence length {q.shape[1]}")
    if streams < 1 or q.shape[1] % streams:
        raise ValueError(f"streams={streams} must be a positive count of equal shards making up the local sequence "
                         f"length {q.shape[1]}")  # fmt: skip


def _split_joint(x: Tensor, joint_len: int, position: str) -> tuple[Tensor, Tensor]:
    """``(B, S_local, ...)`` -> (video part, joint part)."""
    if position == "front":
        return x[:, joint_len:], x[:, :joint_len]
    return x[:, : x.shape[1] - joint_len], x[:, x.shape[1] - joint_len :]


def _sdpa(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None = None) -> Tensor:
    """torch SDPA in layout (B, S, H, D); native autograd."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(1, 2)


def _check_mask(mask: Tensor, batch: int, heads: int, seq_len: int, parallel: ParallelState, joint_len: int,
                kernel: str | None) -> None:  # fmt: skip
    if parallel.ring > 1 or joint_len or kernel is not None:
        why = "ring > 1" if parallel.ring > 1 else "joint tokens" if joint_len else f"kernel {kernel!r}"
        raise NotImplementedError(
            "an attention mask over the whole sequence (other than a boolean padding mask) is exact under Ulysses "
            f"alone, where every rank attends over the whole sequence of its heads; not with {why}: use ring 1 and "
            "the default kernel"
        )
    shape = tuple(mask.shape)
    if len(shape) != 4 or shape[0] not in (1, batch) or shape[1] not in (1, heads) or shape[2:] != (seq_len, seq_len):
        raise ValueError(
            f"mask must be (B or 1, H or 1, S, S) = ({batch} or 1, {heads} or 1, {seq_len}, {seq_len}) over the "
            f"whole sequence; got {shape}"
        )


def _head_group_mask(mask: Tensor, parallel: ParallelState) -> Tensor:
    """This rank's Ulysses head group of a whole-sequence mask ``(B|1, H|1, S, S)`` (a view where it can be): padded
    heads (zero queries, whose outputs are dropped) attend to every key."""
    if mask.shape[1] == 1:
        return mask
    heads = mask.shape[1]
    group = ulysses.padded_heads(heads, parallel) // parallel.ulysses
    start = parallel.ulysses_rank * group
    own = mask[:, start : min(start + group, heads)]
    missing = group - own.shape[1]
    return F.pad(own, (0, 0, 0, 0, 0, missing), value=True if mask.dtype == torch.bool else 0.0) if missing else own


def _masked_sdpa(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor, seq_len: int) -> Tensor:
    """SDPA of the first ``seq_len`` queries of a Ulysses block ``(B, S_block, h, D)`` under a whole-sequence mask
    ``(B|1, h|1, S, S)``, used as it is; the padded queries behind them get zeros (their outputs are dropped), so no
    padded copy of the ``S x S`` mask is made."""
    out = _sdpa(q[:, :seq_len], k, v, scale, mask)
    pad = q.shape[1] - seq_len
    return torch.cat([out, out.new_zeros(out.shape[0], pad, *out.shape[2:])], 1) if pad else out


def _streams_to_batch(x: Tensor, streams: int) -> Tensor:
    """``(B, n*L, ...)``, ``n`` sequences of ``L`` side by side -> ``(B*n, L, ...)``, each its own batch element."""
    return x.unflatten(1, (streams, -1)).flatten(0, 1)


def _streams_from_batch(x: Tensor, streams: int) -> Tensor:
    """Inverse of ``_streams_to_batch``: ``(B*n, L, ...)`` -> ``(B, n*L, ...)``."""
    return x.unflatten(0, (-1, streams)).flatten(1, 2)


def _real_keys_first(x: Tensor, streams: int, valid: int) -> Tensor:
    """A block of ``n`` streams' keys (or values) ``(B, n*L, h, D)``, each stream's ``valid`` real keys first and its
    padding behind, reordered so that all ``n*valid`` real keys come first: attention without a mask does not depend
    on the order of its keys, so the block is then one of ``n*valid`` real keys, as a ring block takes it."""
    if valid * streams == x.shape[1]:
        return x
    parts = x.unflatten(1, (streams, -1))
    return torch.cat([parts[:, :, :valid].flatten(1, 2), parts[:, :, valid:].flatten(1, 2)], 1)


def _joint_key_mask(video_keys: int, joint_len: int, joint_valid: tuple[int, ...], device) -> Tensor:
    """``(B, 1, 1, video_keys + joint_len)`` bool: every video key, and each sample's real joint keys."""
    joint = torch.arange(joint_len, device=device) < torch.tensor(joint_valid, device=device).unsqueeze(1)
    video = torch.ones(len(joint_valid), video_keys, dtype=torch.bool, device=device)
    return torch.cat([video, joint], 1)[:, None, None]


def usp_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    parallel: ParallelState,
    *,
    seq_len: int | None = None,
    joint_len: int = 0,
    joint_position: JointPosition = "front",
    joint_valid: Sequence[int] | None = None,
    scale: float | None = None,
    kernel: str | None = None,
    mask: Tensor | None = None,
    streams: int = 1,
) -> Tensor:
    """Sequence-parallel, non-causal attention over the whole sequence of the SP group.

    Args:
        q, k, v: this rank's shard, ``(B, S_local, H, D)``; SP rank ``i`` holds shard ``i`` of the
            sequence (see ``shard_sequence``). With ``joint_len > 0`` the first (``"front"``) or last
            (``"rear"``) ``joint_len`` positions are joint tokens (e.g. text), identical on every rank,
            attended together with the whole video sequence and attending to it.
        joint_valid: per batch element, how many of the joint tokens are real (they come first; the
            rest is padding, e.g. of a tokenized prompt) and may be attended as keys. Default: all.
        parallel: the layout (``init_parallel``).
        seq_len: the true number of sharded (video) tokens over all ranks, the ``S`` given to
            ``shard_sequence``; its zero padding (when ``S`` is not a multiple of the SP degree) is masked.
            Required when ``sp > 1``: a shard does not show whether it is padded, so a forgotten
            ``seq_len`` (or the length of one shard passed instead) raises rather than attending to the
            padding. In one process it defaults to the local length; a smaller value masks the tail.
        scale: softmax scale, default ``1/sqrt(D)``.
        kernel: local attention kernel name (``dit_sp.attention.KERNELS``); default: best for the
            device and dtype, and torch SDPA where no ring is needed.
        mask: an attention mask over the whole sequence, as SDPA's ``attn_mask`` (boolean, ``True`` attends, or
            additive), ``(B or 1, H or 1, S, S)`` with ``S = seq_len``, the same on every rank (e.g. SkyReels-V2's
            block-causal frames). Ulysses only (``ring == 1``, no joint tokens, the SDPA kernel): after its
            all-to-all every rank holds the whole sequence of its heads, so any mask applies exactly; a ring
            holds one block of keys at a time and raises.
        streams: how many split sequences the shard holds side by side, ``(B, n*S_local, H, D)``: ``n`` shards of
            ``S_local`` positions, each the same rank's shard of its own sequence of ``seq_len`` tokens (split as
            ``shard_sequence`` splits it, padding and all), attended together as one sequence of ``n*seq_len``
            tokens (Motif-Video's decoder layers: a copy of the video attending over itself and the encoder's
            video). No joint tokens and no mask.

    Returns:
        This rank's output shard, ``(B, S_local, H, D)``, joint tokens (or streams) in the same place. Outputs on padded
        positions are unspecified. Gradients of the joint tokens are per-rank partials: their sum over
        the SP group is the full gradient (as for replicated parameters).
    """
    _check_inputs(q, k, v, joint_len, joint_position, streams)
    if streams > 1:
        if joint_len or mask is not None:
            raise ValueError("usp_attention over several split streams takes no joint tokens and no mask")
        return _attend_streams(q, k, v, parallel, streams, seq_len, scale, kernel)
    batch, local_len, heads, head_dim = q.shape
    seq_len = true_length(seq_len, local_len - joint_len, parallel, "usp_attention")
    scale = head_dim**-0.5 if scale is None else scale
    if mask is not None:
        _check_mask(mask, batch, heads, seq_len, parallel, joint_len, kernel)
    if joint_valid is not None:
        joint_valid = tuple(int(n) for n in joint_valid)
        if len(joint_valid) != batch or not all(0 <= n <= joint_len for n in joint_valid):
            raise ValueError(
                f"joint_valid={joint_valid} must give, for each of the {batch} batch elements, a count of real "
                f"joint tokens between 0 and joint_len={joint_len}"
            )
        if all(n == joint_len for n in joint_valid):
            joint_valid = None

    (qv, kv_, vv), joint = zip(*(_split_joint(x, joint_len, joint_position) for x in (q, k, v)))
    # q, k, v travel in one collective: (B, S_local, H, D) -> (B, U*S_local, H_pad/U, D) each
    bq, bk, bv = ulysses.scatter_heads([qv, kv_, vv], parallel)
    block_len = bq.shape[1]
    if joint_len:
        jq, jk, jv = (ulysses.local_heads(ulysses.pad_heads(x, parallel), parallel) for x in joint)
        bq = torch.cat([bq, jq], 1)
    else:
        jk = jv = None

    block_valid = tuple(min(max(seq_len - r * block_len, 0), block_len) for r in range(parallel.ring))
    if parallel.ring == 1 and kernel is None:
        keys, values = bk[:, : block_valid[0]], bv[:, : block_valid[0]]
        if mask is not None:  # no joint tokens (_check_mask)
            return ulysses.gather_heads(
                _masked_sdpa(bq, keys, values, scale, _head_group_mask(mask, parallel), seq_len), parallel, heads
            )
        if joint_len:
            if joint_valid is None or len(set(joint_valid)) == 1:
                # One count of real joint keys for the whole batch (always so for batch 1): the padding is
                # cut off rather than masked, so SDPA runs unmasked (its fastest kernels) and no mask is
                # built on the device each call.
                real = joint_len if joint_valid is None else joint_valid[0]
                jk, jv = jk[:, :real], jv[:, :real]
            else:
                mask = _joint_key_mask(block_valid[0], joint_len, joint_valid, q.device)
            keys, values = torch.cat([keys, jk], 1), torch.cat([values, jv], 1)
        out = _sdpa(bq, keys, values, scale, mask)
    else:
        kern = get_kernel(kernel, q.device, q.dtype, head_dim)
        spec = RingSpec(parallel, kern, scale, block_valid, joint_valid)
        out = ring_attention(bq, bk, bv, spec, jk, jv)

    if not joint_len:
        return ulysses.gather_heads(out, parallel, heads)
    video_out = ulysses.gather_heads(out[:, :block_len], parallel, heads)
    joint_out = ulysses.all_heads(out[:, block_len:], parallel)[:, :, :heads]
    parts = [joint_out, video_out] if joint_position == "front" else [video_out, joint_out]
    return torch.cat(parts, 1)


def _attend_streams(q: Tensor, k: Tensor, v: Tensor, parallel: ParallelState, streams: int, seq_len: int | None,
                    scale: float | None, kernel: str | None) -> Tensor:  # fmt: skip
    """``usp_attention`` of ``streams`` split sequences side by side, ``(B, n*S_local, H, D)`` in and out: each
    stream's shards gathered by Ulysses as a batch element of its own, then the streams of a block side by side
    again, their real keys first (``_real_keys_first``) for the ring's per-block key count."""
    batch, local_len, heads, head_dim = q.shape
    seq_len = true_length(seq_len, local_len // streams, parallel, "usp_attention")
    scale = head_dim**-0.5 if scale is None else scale
    blocks = ulysses.scatter_heads([_streams_to_batch(x, streams) for x in (q, k, v)], parallel)
    bq, bk, bv = (_streams_from_batch(x, streams) for x in blocks)
    block_len = blocks[0].shape[1]
    block_valid = tuple(min(max(seq_len - r * block_len, 0), block_len) for r in range(parallel.ring))
    own = block_valid[parallel.ring_rank]
    bk, bv = (_real_keys_first(x, streams, own) for x in (bk, bv))
    if parallel.ring == 1 and kernel is None:
        out = _sdpa(bq, bk[:, : streams * own], bv[:, : streams * own], scale)
    else:
        kern = get_kernel(kernel, q.device, q.dtype, head_dim)
        spec = RingSpec(parallel, kern, scale, tuple(streams * n for n in block_valid))
        out = ring_attention(bq, bk, bv, spec)
    return _streams_from_batch(ulysses.gather_heads(_streams_to_batch(out, streams), parallel, heads), streams)
