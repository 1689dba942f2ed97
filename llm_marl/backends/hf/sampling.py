"""Choosing tokens from logits: nucleus (top-p) sampling whose randomness belongs to each token, and log-probs.

A sample is an exponential race: token ``i`` of a row's nucleus wins when ``p_i / E_i`` is the largest,
with ``E_i`` exponential noise (the draw has exactly the nucleus's renormalised distribution). The
noise ``E_i`` of a row is a hash of the row's key and of token ``i``'s id (:func:`token_noise`), not a
draw laid out by rank or by batch position, so:

* two computations of the same logits that round differently (a prefill from the KV store against a
  full one, another thread count, another batch) change the sample only when two tokens' ``p / E``
  are equal to within that rounding, or a token sits on the nucleus boundary to within it, instead of
  whenever two nearly equal logits swap ranks;
* a row's sample depends on its key (:func:`row_keys`: the call's seed, the row's index in the call and
  its position in the completion), not on which other rows share the decode batch.
"""
from __future__ import annotations

import torch

NUCLEUS_CANDIDATES = 64   # tokens nucleus_sample ranks first; rows whose top tokens hold less than top_p widen
MASK32 = 0xFFFFFFFF
_MULTIPLIER = 0x45D9F3B   # 27 bits: a 32-bit value times it stays below 2**59, exact in int64


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply, two rounds) on int64 tensors holding 32-bit values: a bijection
    in which each output bit depends on every input bit, in exact int64 arithmetic."""
    x = ((x >> 16) ^ x) * _MULTIPLIER & MASK32
    x = ((x >> 16) ^ x) * _MULTIPLIER & MASK32
    return (x >> 16) ^ x


def row_keys(seed: int, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Noise keys ``[R]`` of rows: a hash of the call's ``seed``, each row's index in the call and its position."""
    key = mix32(torch.full_like(rows, int(seed) & MASK32))
    key = mix32(key ^ (rows & MASK32))
    return mix32(key ^ (positions & MASK32))


_token_hashes: dict[tuple[int, torch.device], torch.Tensor] = {}


def _hashed_tokens(vocab: int, device: torch.device) -> torch.Tensor:
    """``mix32(token id)`` for every id below ``vocab`` (computed once per vocabulary size and device)."""
    table = _token_hashes.get((vocab, device))
    if table is None:
        table = _token_hashes[(vocab, device)] = mix32(
            torch.arange(vocab, dtype=torch.int64, device=device) ^ 0x9E3779B9
        )
    return table


def token_noise(keys: torch.Tensor, token_ids: torch.Tensor, vocab: int | None = None) -> torch.Tensor:
    """Exponential noise ``[R, K]`` (float32) for the tokens ``token_ids [R, K]`` of rows with ``keys [R]``: the
    same key and token id always give the same value, wherever the token sits in the tensor.

    The token id is hashed before it meets the key, so two rows' noise is not one permutation of the other's.
    """
    vocab = vocab if vocab is not None else int(token_ids.max()) + 1
    bits = mix32(keys[:, None] ^ _hashed_tokens(vocab, token_ids.device)[token_ids])
    uniform = ((bits >> 8).to(torch.float32) + 0.5) * 2.0 ** -24          # 24 bits, in (0, 1)
    return uniform.log_().neg_()


def nucleus_sample(logits: torch.Tensor, top_p: float, generator: torch.Generator | None = None,
                   candidates: int = NUCLEUS_CANDIDATES, *, keys: torch.Tensor | None = None) -> torch.Tensor:
    """One token id per row, drawn from the row's nucleus: the most likely tokens holding ``top_p`` of its mass.

    A token is in the nucleus when the tokens ranked above it hold less than ``top_p`` (the set
    transformers' ``TopPLogitsWarper`` keeps; ``top_p=1`` keeps every token). Only the ``candidates``
    most likely tokens of each row are ranked (``topk``, not a sort of the whole vocabulary, which cost
    ~0.1 s per step at 128 rows x 49k tokens); while some row's candidates hold less than ``top_p`` the
    candidates widen 8x, up to the whole vocabulary, so the nucleus is never cut short.

    ``keys`` ``[rows]``: each row's noise key (:func:`row_keys`); without them, keys are drawn from
    ``generator`` (torch's global generator when ``None``).
    """
    rows, vocab = logits.shape
    if keys is None:
        keys = torch.randint(0, 2**32, (rows,), generator=generator, dtype=torch.int64).to(logits.device)
    if top_p >= 1.0:
        index = torch.arange(vocab, device=logits.device).expand(rows, vocab)
        probs = torch.softmax(logits, dim=-1)
        keep = None
    else:
        log_total = torch.logsumexp(logits, dim=-1, keepdim=True)
        width = min(candidates, vocab)
        while True:
            top, index = logits.topk(width, dim=-1)                 # descending
            probs = torch.exp(top - log_total)
            if width == vocab or bool((probs.sum(-1) >= top_p).all()):
                break
            width = min(width * 8, vocab)
        above = probs.cumsum(-1) - probs                             # mass of the tokens ranked above each one
        keep = above < top_p
        keep[:, 0] = True
    race = probs / token_noise(keys, index, vocab)                  # exponential race: argmax is a draw from probs
    if keep is not None:
        race = torch.where(keep, race, torch.full_like(race, -1.0))
    return index.gather(-1, race.argmax(-1, keepdim=True)).squeeze(-1)


def chosen_logprobs_(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[row, ids[row]]`` per row, computed in place: ``logits`` is overwritten.

    ``z[y] - max - log(sum(exp(z - max)))`` without a second ``[rows, vocab]`` tensor (12.6 MB per decode step
    at 64 rows over SmolLM2's 49k words), which a decode step would otherwise allocate and fill.
    """
    chosen = logits.gather(-1, ids[:, None]).squeeze(-1)
    top = logits.amax(-1, keepdim=True)
    return chosen - top.squeeze(-1) - logits.sub_(top).exp_().sum(-1).log()
