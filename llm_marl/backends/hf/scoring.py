"""`Scoring`: log-probs of given completions under an adapter or the reference policy, with gradients (the
trainers' losses), through forwards that run a group's shared prompt once."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ..head_logprobs import head_logprobs
from .compat import cache_keyword, cache_parameter, enable_activation_checkpointing
from .kv_rows import left_pad, shared_rows

LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")   # config fields that change logits


def completion_targets(completion_ids: Sequence[list[int]], width: int, pad_id: int) -> torch.Tensor:
    """Completion token ids right-padded to ``[B, width]`` (the targets of :meth:`Scoring.completion_forward`)."""
    return torch.tensor([list(c) + [pad_id] * (width - len(c)) for c in completion_ids], dtype=torch.long)


class Scoring:
    """Scoring methods of :class:`~llm_marl.backends.hf.HFPolicy` (a mixin: the policy holds ``model``, ``pad_id``,
    ``device``, ``lockstep``, ``is_peft`` and ``using``)."""

    model: Any
    pad_id: int
    lockstep: bool
    gradient_checkpointing: bool = False

    # ------------------------------------------------------------------ memory
    def enable_gradient_checkpointing(self) -> None:
        """Recompute decoder-layer activations in the backward pass of the scoring forward (not in sampling).

        transformers checkpoints a layer only in training mode; the model stays in eval mode (see the
        policy's docstring), so :meth:`completion_forward` flags just the checkpointed layers as training
        while gradients are on — dropout and every other module keep their eval behaviour.
        """
        enable_activation_checkpointing(self.model.get_base_model() if self.is_peft else self.model)
        self.gradient_checkpointing = True

    @contextlib.contextmanager
    def _checkpointing(self):
        """Flag the checkpointed layers as training for one forward with gradients.

        See :meth:`enable_gradient_checkpointing`.
        """
        if not (self.gradient_checkpointing and torch.is_grad_enabled()):
            yield
            return
        layers = [
            m for m in self.model.modules() if getattr(m, "gradient_checkpointing", False) is True and not m.training
        ]
        for layer in layers:
            layer.training = True
        try:
            yield
        finally:
            for layer in layers:
                layer.training = False

    # ------------------------------------------------------------------ log-probs
    def token_logprobs(
        self,
        prompt_ids: Sequence[list[int]],
        completion_ids: Sequence[list[int]],
        *,
        adapter: str | None = None,
        temperature: float = 1.0,
        reference: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs ``[B, L]`` of the completions given the prompts, and their mask ``[B, L]``.

        Uses ``adapter`` (with gradients) or, when ``reference`` is true, the reference policy —
        the base with adapters disabled — without gradients. ``temperature`` scales logits as
        during sampling (0 means unscaled).
        """
        context = torch.no_grad() if reference else contextlib.nullcontext()
        head = self.plain_output_layer()
        if head is not None:
            with context, self.using(None if reference else adapter):
                hidden, width, completion_mask = self.completion_hidden(prompt_ids, completion_ids)
                targets = completion_targets(completion_ids, width, self.pad_id).to(hidden.device)
                chosen = completion_mask.bool()
                values = head_logprobs(hidden[chosen], head.weight, head.bias, targets[chosen], temperature)
            logprobs = torch.zeros(completion_mask.shape, dtype=values.dtype, device=values.device)
            return logprobs.masked_scatter(chosen, values), chosen
        with context, self.using(None if reference else adapter):
            logits, width, completion_mask = self.completion_logits(prompt_ids, completion_ids)
        logits = logits.float()
        targets = completion_targets(completion_ids, width, self.pad_id).to(logits.device)
        if temperature > 0:
            logits = logits / temperature
        # log pi(y_t) = z_t[y_t] - logsumexp(z_t): avoids materialising a second [B, L, V] tensor
        logprobs = logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        return logprobs * completion_mask, completion_mask.bool()

    def plain_output_layer(self) -> torch.nn.Linear | None:
        """The output layer when logits are exactly ``head(final hidden state)`` and scoring may apply it itself.

        ``None`` (score through the model's own forward) for sharded weights (FSDP gathers them in the
        forward), a head that is not a plain ``nn.Linear`` (e.g. LoRA on the head) or a model that
        transforms its logits (soft-capping, logit scales).
        """
        if self.lockstep or not hasattr(self.model, "get_output_embeddings"):
            return None
        base = self.model.get_base_model() if self.is_peft else self.model
        head = base.get_output_embeddings()
        config = base.config
        transformed = any(getattr(config, name, None) not in (None, 1, 1.0) for name in LOGIT_TRANSFORMS)
        if (type(head) is not torch.nn.Linear or isinstance(head.weight, DTensor) or transformed
                or not hasattr(base, "get_decoder")):
            return None
        return head

    # ------------------------------------------------------------------ forwards
    def scoring_rows(self, prompt_ids: Sequence[list[int]],
                      completion_ids: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(ids, mask, width)`` of ``[left pad][prompt][completion][right pad]`` rows.

        Completions are in the last ``width`` columns.
        """
        if len(prompt_ids) != len(completion_ids) or not prompt_ids:
            raise ValueError(f"need one completion per prompt (got {len(prompt_ids)} prompts, {len(completion_ids)} "
                             f"completions), at least one")
        width = max(1, max(len(c) for c in completion_ids))
        rows = [list(p) + list(c) + [self.pad_id] * (width - len(c)) for p, c in zip(prompt_ids, completion_ids)]
        ids, mask = left_pad(rows, self.pad_id)
        for row, c in enumerate(completion_ids):
            if width - len(c):
                mask[row, -(width - len(c)):] = 0      # right padding after a short completion
        return ids, mask, width

    def completion_hidden(self, prompt_ids: Sequence[list[int]],
                          completion_ids: Sequence[list[int]]) -> tuple[torch.Tensor, int, torch.Tensor]:
        """``(hidden [B, width, d], width, completion mask)``: the final hidden state each completion token was
        chosen from (what the output layer turns into its logits).

        The same forwards as :meth:`completion_logits` (a group's shared prompt once) through the decoder alone,
        with one embedding lookup for all their tokens: a trained embedding gets one gradient, not one per forward.
        """
        base = self.model.get_base_model() if self.is_peft else self.model
        decoder, embed = base.get_decoder(), base.get_input_embeddings()
        cache_name = cache_parameter(type(decoder))
        source, firsts = shared_rows([tuple(p) for p in prompt_ids])
        checkpointing = self.gradient_checkpointing and torch.is_grad_enabled()
        device = self.device
        if len(firsts) == len(prompt_ids) or len(completion_ids) != len(prompt_ids) or checkpointing:
            ids, mask, width = self.scoring_rows(prompt_ids, completion_ids)
            ids, mask = ids.to(device), mask.to(device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            with self._checkpointing():
                out = decoder(inputs_embeds=embed(ids), attention_mask=mask, position_ids=positions, use_cache=False)
            return out.last_hidden_state[:, -width - 1:-1], width, mask[:, -width:]
        width = max(1, max(len(c) for c in completion_ids))

        def prepare(ids: torch.Tensor, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            embedded = embed(torch.cat([ids.flatten(), inputs.flatten()]))      # one lookup for both forwards
            return (embedded[:ids.numel()].view(*ids.shape, -1),
                    embedded[ids.numel():].view(*inputs.shape, embedded.shape[-1]))

        def forward(embeds, mask, positions, cache, last_only: bool) -> torch.Tensor:
            hidden = decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=True,
                             **{cache_name: cache}).last_hidden_state
            return hidden[:, -1:] if last_only else hidden

        hidden, completion_mask = self._prompt_then_completions(prompt_ids, completion_ids, source, firsts, width,
                                                                prepare, forward)
        return hidden, width, completion_mask

    def completion_logits(self, prompt_ids: Sequence[list[int]],
                          completion_ids: Sequence[list[int]]) -> tuple[torch.Tensor, int, torch.Tensor]:
        """``(logits [B, width, V], width, completion mask)``: the logits each completion token was sampled from.

        Rows that share a prompt (the G samples of one agent in a group) run it once: a forward over
        the distinct prompts fills a KV cache, each row gets a copy of its prompt's cache, and a
        second forward runs the completions on top of it; gradients flow through both. Without a
        repeated prompt, or with gradient checkpointing on (it recomputes layers without a KV cache),
        this is one :meth:`completion_forward`. Under ``lockstep`` (sharded weights: every process must
        make the same forward calls) it is always the two forwards, unless checkpointing.
        """
        source, firsts = shared_rows([tuple(p) for p in prompt_ids])
        checkpointing = self.gradient_checkpointing and torch.is_grad_enabled()
        distinct = len(firsts) == len(prompt_ids) and not self.lockstep
        if distinct or len(completion_ids) != len(prompt_ids) or checkpointing:
            output, width, completion_mask = self.completion_forward(prompt_ids, completion_ids)
            return output.logits[:, :-1, :], width, completion_mask
        width = max(1, max(len(c) for c in completion_ids))
        if self.lockstep:
            width = max(width, 2)     # always both forwards: every process makes the same calls

        def forward(ids, mask, positions, cache, last_only: bool) -> torch.Tensor:
            return self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                              **cache_keyword(self.model, cache), use_cache=True,
                              logits_to_keep=1 if last_only else 0).logits

        logits, completion_mask = self._prompt_then_completions(prompt_ids, completion_ids, source, firsts, width,
                                                                lambda ids, inputs: (ids, inputs), forward)
        return logits, width, completion_mask

    def _prompt_then_completions(self, prompt_ids: Sequence[list[int]], completion_ids: Sequence[list[int]],
                                 source: list[int], firsts: list[int], width: int,
                                 prepare: Callable[[torch.Tensor, torch.Tensor], tuple[Any, Any]],
                                 forward: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The two scoring forwards of rows that share prompts (:func:`shared_rows`' ``source`` and ``firsts``):
        the distinct prompts once into a KV cache, a differentiable copy of it to each row, then the completions.

        ``prepare(prompt ids [U, P], completion inputs [B, width - 1])`` gives what ``forward(inputs, mask,
        positions, cache, last_only)`` takes; ``forward`` returns ``[rows, T, ...]`` (only the last position when
        ``last_only``). Returns ``(outputs [B, width, ...], completion mask [B, width])``: row ``b``'s output at
        ``k`` is the one completion token ``k`` was chosen from.
        """
        from transformers import DynamicCache

        device = self.device
        ids, prompt_mask = left_pad([prompt_ids[r] for r in firsts], self.pad_id)
        ids, prompt_mask = ids.to(device), prompt_mask.to(device)
        prompt_inputs, completion_inputs = prepare(
            ids, completion_targets(completion_ids, width, self.pad_id)[:, :-1].to(device))
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        expand = torch.tensor(source, dtype=torch.long, device=device)
        outputs = forward(prompt_inputs, prompt_mask, positions, cache, True)[expand]   # chose completion token 0
        completion_mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completion_ids],
                                       dtype=torch.long, device=device)
        if width > 1:
            cache.batch_select_indices(expand)                         # differentiable copy to each row
            mask = torch.cat([prompt_mask[expand], completion_mask[:, :-1]], dim=1)
            steps = positions[expand][:, -1:] + 1 + torch.arange(width - 1, device=device)
            outputs = torch.cat([outputs, forward(completion_inputs, mask, steps, cache, False)], dim=1)
        return outputs, completion_mask

    def completion_forward(self, prompt_ids: Sequence[list[int]], completion_ids: Sequence[list[int]], *,
                           output_hidden_states: bool = False) -> tuple[Any, int, torch.Tensor]:
        """One forward over ``[left pad][prompt][completion][right pad]`` rows with the active adapter.

        Returns ``(output, width, completion_mask)``: completions fill the last ``width`` columns, and the
        output at the position before completion token ``k`` is the state in which token ``k`` was chosen
        (``output.logits`` keeps those ``width + 1`` positions; with ``output_hidden_states`` only the last
        position's logits are kept and ``output.hidden_states`` carries every position).
        """
        ids, mask, width = self.scoring_rows(prompt_ids, completion_ids)
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with self._checkpointing():
            output = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                                logits_to_keep=1 if output_hidden_states else width + 1,
                                output_hidden_states=output_hidden_states)
        return output, width, mask[:, -width:]
