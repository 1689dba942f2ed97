"""`DecodeLoop`: the decode loop of a generate call (prefill, then one cached forward per step), and `DecodeRows`,
what each row has generated so far.

Each step: choose every row's next tokens from the last logits (:func:`choose_tokens`), append them
(:meth:`DecodeRows.take`), drop finished rows once a quarter have (their caches stored first), and run
the next forward on each row's newest token and its prompt-lookup drafts (greedy only).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...policy import SamplingParams
from ..prompt_lookup import DraftRecord, PromptLookup, accepted_drafts, step_width
from .compat import cache_keyword
from .kv_rows import MIN_DECODE_ROWS, forget_rejected_drafts, rows_to_keep
from .sampling import chosen_logprobs_, nucleus_sample, row_keys


def repeated_ngram_tokens(completion: Sequence[int], n: int) -> list[int]:
    """The tokens that would complete an ``n``-gram ``completion`` already holds (its last ``n - 1`` tokens
    followed by them somewhere before)."""
    if n < 1 or len(completion) < n - 1:
        return []
    if n == 1:
        return sorted(set(completion))
    tail = tuple(completion[len(completion) - n + 1:])
    return sorted({completion[i + n - 1] for i in range(len(completion) - n + 1)
                   if tuple(completion[i:i + n - 1]) == tail})


def choose_tokens(logits: torch.Tensor, params: SamplingParams, keys: torch.Tensor | None,
                  completions: Sequence[Sequence[int]] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen [rows, positions], log-probs)`` from ``logits [rows, positions, V]`` (overwritten).

    Greedy (``temperature == 0``) takes the argmax at every position fed; otherwise the first position is
    scaled by the temperature and sampled from its nucleus with the rows' noise ``keys``. With
    ``params.no_repeat_ngram`` each row's first position first bans the tokens that would repeat an n-gram
    of the row's ``completions`` entry (one position is fed per step then: no drafts).
    """
    if params.no_repeat_ngram:
        for row, completion in enumerate(completions):
            banned = repeated_ngram_tokens(completion, params.no_repeat_ngram)
            if banned:
                logits[row, 0, banned] = float("-inf")
    if params.temperature == 0:
        chosen = logits.argmax(-1)
    else:
        logits = logits.div_(params.temperature)
        chosen = nucleus_sample(logits[:, 0], params.top_p, keys=keys)[:, None]
    return chosen, chosen_logprobs_(logits.view(-1, logits.shape[-1]), chosen.reshape(-1)).view(chosen.shape)


class DecodeRows:
    """The rows of one decode: per batch row its prompt, adapter, tokens and log-probs so far and whether it
    finished; per cache row (``live``: the batch row it holds) the draft tokens fed in the last step."""

    def __init__(self, prompts: list[list[int]], adapters: list[str | None], max_new_tokens: int,
                 stop_ids: Sequence[int], pad_id: int, lookahead: int, device: torch.device) -> None:
        batch = len(prompts)
        self.prompts, self.adapters = prompts, adapters
        self.max_new_tokens, self.stop_ids, self.pad_id, self.lookahead = (
            max_new_tokens,
            set(stop_ids),
            pad_id,
            lookahead,
        )
        self.completions: list[list[int]] = [[] for _ in range(batch)]   # per batch row, its stop token included
        self.logprobs: list[list[float]] = [[] for _ in range(batch)]
        self.finished = [False] * batch
        self.lookups = [PromptLookup(p) for p in prompts] if lookahead else []
        self.records = [DraftRecord() for _ in range(batch)] if lookahead else []   # how each row's drafts held
        self.live = torch.arange(batch, device=device)
        self.drafts: list[list[int]] = [[] for _ in range(batch)]
        self.device = device

    def noise_keys(self, seed: int) -> torch.Tensor:
        """Each cache row's sampling noise key: the call's seed, the row's index in the call, its next position."""
        positions = torch.tensor([len(self.completions[r]) for r in self.live.tolist()], device=self.device)
        return row_keys(seed, self.live, positions)

    def take(self, chosen: torch.Tensor, values: torch.Tensor) -> tuple[list[int], list[int]]:
        """Append each row's drafts up to the first the model disagrees with, then its own next token.

        Returns ``(feed, kept)`` per cache row: the token to feed next (the pad once a row finished; a stop
        token is fed too, as its states are stored) and how many of its drafts it kept.
        """
        feed, kept = [], []
        for row, (batch_row, tokens, scores) in enumerate(zip(self.live.tolist(), chosen.tolist(), values.tolist())):
            accepted = accepted_drafts(self.drafts[row], tokens)
            kept.append(accepted)
            if self.drafts[row]:
                self.records[batch_row].update(len(self.drafts[row]), accepted)
            if self.finished[batch_row]:
                feed.append(self.pad_id)
                continue
            taken = 0
            for token, value in zip(tokens[:accepted + 1], scores[:accepted + 1]):
                self.completions[batch_row].append(token)
                self.logprobs[batch_row].append(value)
                taken += 1
                if token in self.stop_ids or len(self.completions[batch_row]) == self.max_new_tokens:
                    self.finished[batch_row] = True
                    break
            feed.append(tokens[accepted] if taken == accepted + 1 else self.pad_id)   # a stop among drafts was fed
            if self.lookups:
                self.lookups[batch_row].extend(tokens[:taken])
        return feed, kept

    def done(self) -> torch.Tensor:
        """``[cache rows]``: whether each row finished."""
        return torch.tensor([self.finished[r] for r in self.live.tolist()], device=self.device)

    def held(self, cache_rows: list[int]) -> tuple[list[list[int]], list[str | None], list[list[int]]]:
        """``(prompts, adapters, completions)`` of the batch rows held in ``cache_rows``."""
        rows = self.live[cache_rows].tolist() if cache_rows else []
        return [self.prompts[r] for r in rows], [self.adapters[r] for r in rows], [self.completions[r] for r in rows]

    def step_ids(self, feed: torch.Tensor, free_positions: float) -> torch.Tensor:
        """``[cache rows, width]``: each row's next token, then the prompt-lookup drafts this step feeds."""
        rows = self.live.tolist()
        drafts = [self.lookups[r].draft(min(self.lookahead, self.max_new_tokens - len(self.completions[r]) - 1))
                  if self.lookups and not self.finished[r] else [] for r in rows]
        width = step_width(drafts, [self.records[r].rate for r in rows], free_positions) if self.lookups else 1
        self.drafts = [draft[:width - 1] for draft in drafts]
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        ids[:, 0] = feed
        for row, tokens in enumerate(self.drafts):
            ids[row, 1:1 + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        return ids


class DecodeLoop:
    """The decode loop of :class:`~llm_marl.backends.hf.HFPolicy` (a mixin: the policy holds ``model``, ``device``,
    ``stop_ids``, ``pad_id``, the options, the counters, and the :class:`~llm_marl.backends.hf.prefill.StoredPrefill`
    and :class:`~llm_marl.backends.hf.adapters.AdapterAccess` methods)."""

    model: Any

    def _decode(self, prompts: list[list[int]], adapters: list[str | None], params: SamplingParams,
                step_threads: Callable[[], int] | None = None):
        """Prefill, then cached forwards of each row's next token; returns ids, log-probs and EOS flags per row.

        ``step_threads``, if given, is asked for the torch threads of every decode step.

        The prefill (:meth:`_prefill`) runs each distinct prompt once, past its stored prefix with
        ``reuse_cache``. Once a quarter of the rows running have finished (EOS), they leave the batch
        (:func:`rows_to_keep`; their caches are stored first). With greedy decoding and ``draft_tokens``,
        a step feeds each row's next token and its prompt-lookup drafts, and keeps the drafts up to the
        first one the model's choice differs from (:func:`forget_rejected_drafts` removes the others'
        states). Sampling noise is keyed by the call's seed (drawn from torch's generator without one),
        each row's index in the call and its position (:func:`~llm_marl.backends.hf.sampling.row_keys`).
        """
        self._check_room(prompts, params.max_new_tokens)
        greedy = params.temperature == 0
        seed = None if greedy else params.seed if params.seed is not None else int(torch.randint(0, 2**31 - 1, ()))
        device = self.device
        rows = DecodeRows(prompts, adapters, params.max_new_tokens, self.stop_ids, self.pad_id,
                          self.draft_tokens if greedy and not params.no_repeat_ngram else 0, device)
        was_training = self.model.training
        self.model.eval()
        try:
            with self._mixed_batch() as select:
                began = time.perf_counter()
                prefill = self._prefill(prompts, adapters, params.max_new_tokens, select)
                logits, cache, mask, position = prefill.logits, prefill.cache, prefill.mask, prefill.position
                prefilled = time.perf_counter()
                self.prefill_seconds += prefilled - began
                kwargs = select(adapters)
                while True:
                    wanted = step_threads() if step_threads is not None else None
                    if wanted is not None and wanted != torch.get_num_threads():
                        torch.set_num_threads(wanted)    # asked once: the share can change between two asks
                    fed = max(map(len, rows.drafts))
                    held = [rows.completions[r] for r in rows.live.tolist()] if params.no_repeat_ngram else ()
                    chosen, values = choose_tokens(logits, params, None if greedy else rows.noise_keys(seed), held)
                    feed, kept = rows.take(chosen, values)
                    if fed:
                        self.draft_tokens_accepted += sum(kept)
                        mask = forget_rejected_drafts(cache, mask, fed, kept)
                        position = position + torch.tensor(kept, dtype=position.dtype, device=device)
                    if all(rows.finished):
                        break
                    feed = torch.tensor(feed, dtype=torch.long, device=device)
                    keep = rows_to_keep(rows.done(), MIN_DECODE_ROWS) if self.drop_finished_rows else None
                    if keep is not None:                       # drop finished rows (storing their caches first)
                        mask, position, feed = self._drop_rows(rows, keep, cache, mask, position, feed)
                        kwargs = select(rows.held(list(range(len(rows.live))))[1])
                    step_ids = rows.step_ids(feed, self.draft_free_positions)
                    width = step_ids.shape[1]
                    self.draft_tokens_fed += sum(map(len, rows.drafts))
                    mask = torch.cat([mask, mask.new_ones((len(step_ids), width))], dim=1)
                    positions = position[:, None] + torch.arange(1, width + 1, device=device)
                    out = self.model(input_ids=step_ids.to(device), attention_mask=mask, position_ids=positions,
                                     **cache_keyword(self.model, cache), use_cache=True, logits_to_keep=width,
                                     **kwargs)
                    logits = out.logits[:, -width:, :].float()
                    position = position + 1                    # the chosen token; drafts count once kept
                    self.decode_steps += 1
                self.decode_seconds += time.perf_counter() - prefilled
        finally:
            self.model.train(was_training)
        for key in prefill.extended:                           # superseded by the sequences that extend them
            self.kv_cache.drop(key)
        if self.reuse_cache:
            self._store(cache, mask, list(range(len(rows.live))), *rows.held(list(range(len(rows.live)))))
        finished = [bool(c) and c[-1] in rows.stop_ids for c in rows.completions]
        return rows.completions, rows.logprobs, finished

    def _drop_rows(self, rows: DecodeRows, keep: torch.Tensor, cache, mask: torch.Tensor, position: torch.Tensor,
                   feed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keep only the cache rows ``keep`` (storing the others' caches first); returns the kept mask, positions
        and next tokens."""
        dropped = rows.done().nonzero().squeeze(-1)
        dropped = dropped[~torch.isin(dropped, keep)].tolist()
        if self.reuse_cache:
            self._store(cache, mask, dropped, *rows.held(dropped))
        cache.batch_select_indices(keep)
        rows.live = rows.live[keep]
        return mask[keep], position[keep], feed[keep]

    def _check_room(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        """``ValueError`` when the longest prompt and ``max_new_tokens`` exceed the model's positions."""
        limit = getattr(self.model.config, "max_position_embeddings", None)
        longest = max(len(p) for p in prompts)
        if limit is not None and longest + max_new_tokens > limit:
            raise ValueError(f"prompt of {longest} tokens + max_new_tokens={max_new_tokens} exceeds the "
                             f"model's {limit} positions; shorten the prompt or lower max_new_tokens")
