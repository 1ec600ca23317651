"""Prompt-length buckets: a prompt left-padded to one of a few lengths, so that a new prompt
length does not compile again.

The backend lowers each partition per concrete input shape (``runtime``: one program per
signature). A served model sees a new prompt length on almost every request, and the prefill
graph's shapes follow it. As AWS's serving stack does for Trainium (NxD Inference compiles a
model for a set of sequence-length buckets and pads each request to the smallest bucket that
holds it), ``bucket_prompt`` pads the prompt on the left to its bucket and masks the padding:

    ids, mask = neuron_compiler.bucket_prompt(prompt_ids, buckets=(16, 32, 64))
    model.generate(ids, attention_mask=mask, cache_implementation="static", ...)

Every prompt of a bucket then has the same shapes: the prefill graph and its programs are
compiled once per bucket (twice at most: a prompt that fills its bucket exactly has an
all-ones mask, for which transformers takes another path) and the decode graph once.

Invariants
- The padding goes on the LEFT, with ``attention_mask`` 0 over it and the caller's mask (or
  ones) over the prompt: the prompt's last token stays last, where generation continues. A
  transformers causal LM given that mask ignores the padded positions (its position ids come
  from the mask's cumulative sum, and the static cache's padded rows are masked in every later
  step), so the generated tokens are the unpadded prompt's, up to floating-point rounding.
- The bucket is the smallest of ``buckets`` that holds the prompt; a prompt longer than every
  bucket raises ``ValueError`` naming its length and the largest bucket (never a silent cut).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

SMALLEST_BUCKET = 16


def prompt_buckets(limit: int, smallest: int = SMALLEST_BUCKET) -> tuple[int, ...]:
    """Powers of two from ``smallest`` below ``limit``, then ``limit`` itself: the bucket
    lengths for prompts of at most ``limit`` tokens (e.g. the model's positions minus the
    tokens to generate)."""
    if limit < 1 or smallest < 1:
        raise ValueError(f"prompt_buckets: limit and smallest must be >= 1, got {limit}, "
                         f"{smallest}")
    out, b = [], smallest
    while b < limit:
        out.append(b)
        b *= 2
    return tuple(out) + (limit,)


@dataclass(frozen=True)
class BucketedPrompt:
    """A prompt padded to its bucket. Unpacks as ``ids, mask = bucket_prompt(...)``."""

    input_ids: torch.Tensor          # [batch, bucket]
    attention_mask: torch.Tensor     # [batch, bucket]: 0 over the padding
    length: int                      # the prompt's own length
    bucket: int

    @property
    def padding(self) -> int:
        return self.bucket - self.length

    def __iter__(self):
        return iter((self.input_ids, self.attention_mask))


def bucket_prompt(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                  buckets: tuple[int, ...] | list[int], pad_token_id: int = 0) -> BucketedPrompt:
    """``input_ids`` [batch, L] left-padded with ``pad_token_id`` to the smallest bucket >= L,
    with its attention mask (module docstring)."""
    if not (isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2
            and not input_ids.is_floating_point()):
        raise ValueError(f"bucket_prompt: input_ids must be an integer tensor [batch, length], "
                         f"got {getattr(input_ids, 'dtype', type(input_ids).__name__)} "
                         f"{tuple(getattr(input_ids, 'shape', ()))}")
    sizes = sorted(int(b) for b in buckets)
    if not sizes or sizes[0] < 1:
        raise ValueError(f"bucket_prompt: buckets must be lengths >= 1, got {list(buckets)}")
    batch, length = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    elif tuple(attention_mask.shape) != (batch, length):
        raise ValueError(f"bucket_prompt: attention_mask has shape {tuple(attention_mask.shape)}, "
                         f"input_ids {(batch, length)}")
    bucket = next((b for b in sizes if b >= length), None)
    if bucket is None:
        raise ValueError(f"bucket_prompt: a prompt of {length} tokens is longer than the largest "
                         f"bucket, {sizes[-1]}: add a bucket of at least {length}")
    pad = bucket - length
    ids = torch.cat([input_ids.new_full((batch, pad), pad_token_id), input_ids], dim=1)
    mask = torch.cat([attention_mask.new_zeros((batch, pad)), attention_mask], dim=1)
    return BucketedPrompt(ids, mask, length, bucket)
