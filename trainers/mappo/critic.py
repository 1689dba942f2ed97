"""The centralized critic's input: the task plus every agent's answers so far.

MAPoRL's original critic read only the question. Ours reads the joint history, because the
influence-aware return of agent ``i`` at turn ``t`` depends on what the OTHER agents answer
next, which in turn depends on what they have already said. The critic of agent ``i``'s answer
at turn ``t`` sees:

* the task (agent ``i``'s opening prompt, rendered as text, followed by every other agent's opening
  user messages that differ from agent ``i``'s: on an env where each agent holds a private view the
  critic reads every view, :func:`critic_task_text`),
* every agent's answers of turns ``0 .. t-1`` (the history the debate has produced),
* the OTHER agents' answers of turn ``t`` (answered simultaneously with ``i``), and
* agent ``i``'s answer of turn ``t``, whose tokens receive the per-token values.

Conditioning on the others' simultaneous answers is allowed because a baseline may depend on
anything that does not depend on agent ``i``'s own action (the others sample independently of
``i`` given the history), and it removes the variance those answers add to ``R_i^t``.
The critic is centralized only during training; the actors still see only their own history.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from llm_marl_envs.core import render_messages

SEPARATOR = "\n\n"          # between the parts of a critic context


def critic_task_text(openings: Mapping[str, Sequence[Mapping[str, str]]], agent: str) -> str:
    """The task the critic of ``agent`` reads: its opening prompt, then each other agent's opening user messages
    that ``agent``'s opening lacks (none when every agent reads the same question, as in a debate)."""
    if agent not in openings:
        raise ValueError(f"agent {agent!r} has no opening prompt; agents are {sorted(openings)}")
    own = openings[agent]
    seen = {m["content"] for m in own if m.get("role") == "user"}
    parts = [render_messages(own)]
    for other, messages in openings.items():
        extra = [m for m in messages if m.get("role") == "user" and m["content"] not in seen]
        if other != agent and extra:
            parts.append(f"{other}'s view:\n" + "\n".join(m["content"] for m in extra))
    return SEPARATOR.join(parts)


def critic_context(task_text: str, answers: Sequence[Mapping[str, str]], agent: str, turn: int) -> str:
    """Text the critic reads before agent ``agent``'s turn-``turn`` answer (see the module docstring)."""
    return SEPARATOR.join(critic_context_parts(task_text, answers, agent, turn))


def critic_context_parts(task_text: str, answers: Sequence[Mapping[str, str]], agent: str, turn: int) -> list[str]:
    """The critic context in parts: the task, each earlier answer (oldest first), then the agent's own header.

    :meth:`CentralizedCritic.context_ids` drops whole answers from the oldest on when the context is
    too long, so the task and the latest answers survive truncation.
    """
    if turn < 0 or turn >= len(answers):
        raise ValueError(f"turn must be in [0, {len(answers)}) for a history of {len(answers)} turns, got {turn}")
    if agent not in answers[turn]:
        raise ValueError(f"agent {agent!r} has no answer at turn {turn}; agents there are {sorted(answers[turn])}")
    parts = [f"Task:\n{task_text.strip()}"]
    for t in range(turn):
        for other, text in answers[t].items():
            parts.append(f"Turn {t}, {other} answered:\n{text.strip()}")
    for other, text in answers[turn].items():
        if other != agent:
            parts.append(f"Turn {turn}, {other} answered:\n{text.strip()}")
    parts.append(f"Turn {turn}, {agent} answers:\n")
    return parts


class CentralizedCritic(torch.nn.Module):
    """Value model: the policies' shared base with the critic's own LoRA adapter and a scalar head.

    It shares the frozen base of a LoRA :class:`~llm_marl.backends.hf.HFPolicy` (one more
    adapter, named ``adapter``, costs a few MB instead of a second model) and reads, for every
    completion token ``k``, the hidden state of the position before it — the state in which the
    token was chosen — so ``V_k`` pairs with the log-prob of token ``k`` as GAE needs.

    ``depth``: the critic runs only the base's first ``depth`` decoder layers (then its final norm and
    the head), a smaller value model on the same base; ``layers``: its adapter adapts the top ``layers``
    of those, and the frozen ones below can run once per step (:meth:`trunk`).
    """

    def __init__(self, policy: Any, adapter: str = "critic", lora_r: int = 8, max_context_tokens: int = 768,
                 seed: int = 0, layers: int | None = None, depth: int | None = None) -> None:
        super().__init__()
        if not getattr(policy, "is_peft", False):
            raise ValueError(f"the centralized critic shares a LoRA base; policy {policy.name!r} is a plain model. "
                             "Build the team with Team.adapter_per_agent(...) or Team.separate(..., lora_config=...)")
        if max_context_tokens < 1:
            raise ValueError(f"max_context_tokens must be >= 1, got {max_context_tokens}")
        from llm_marl.team import default_lora_config

        self.policy, self.adapter, self.max_context_tokens = policy, adapter, max_context_tokens
        self.depth = self._depth(depth)
        self.first_layer = self._first_adapted_layer(layers)
        if adapter not in policy.adapter_names:
            lora = default_lora_config(r=lora_r)
            if self.first_layer or self.depth < len(self._decoder().layers):
                lora = default_lora_config(r=lora_r, target_modules=self._linear_names())
                lora.layers_to_transform = list(range(self.first_layer, self.depth))
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                policy.model.add_adapter(adapter, lora)
            policy.model.eval()
        self.head = torch.nn.Linear(policy.model.config.hidden_size, 1)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            torch.nn.init.normal_(self.head.weight, std=0.01)
            torch.nn.init.zeros_(self.head.bias)

    def context_ids(self, context: str | Sequence[str]) -> list[int]:
        """Token ids of a critic context of at most ``max_context_tokens`` tokens.

        A plain string keeps its last tokens. Parts from :func:`critic_context_parts` keep the task
        (its last tokens if the task alone is too long) and the agent's header, then as many of the
        latest answers as fit: the oldest turns go first, never the task.
        """
        tokenize = lambda text: list(self.policy.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        budget = self.max_context_tokens
        if isinstance(context, str):
            return tokenize(context)[-budget:]
        task, rest = self.split_context_ids(context)
        return task + rest

    def split_context_ids(self, parts: Sequence[str], shared: int = 1) -> tuple[list[int], list[int]]:
        """:meth:`context_ids` of :func:`critic_context_parts` in two pieces: the tokens of the first ``shared`` parts
        that it keeps (the task; with ``shared = 1 + answers of earlier turns``, those answers too), then the rest's.
        Contexts whose first pieces are equal (a tree's rows under one node) share it, and the critic runs it once.
        """
        tokenize = lambda text: list(self.policy.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        budget = self.max_context_tokens
        parts = list(parts)
        if len(parts) < 2:
            raise ValueError(f"critic context parts need the task and the agent's header, got {len(parts)} part(s)")
        if shared < 1:
            raise ValueError(f"the shared piece holds at least the task: shared >= 1, got {shared}")
        header = tokenize(SEPARATOR + parts[-1])[-budget:]
        task = tokenize(parts[0])[-max(budget - len(header), 0):] if budget > len(header) else []
        kept: list[tuple[int, list[int]]] = []
        room = budget - len(header) - len(task)
        for index in range(len(parts) - 2, 0, -1):     # newest answer first
            ids = tokenize(SEPARATOR + parts[index])
            if len(ids) > room:
                break
            kept.insert(0, (index, ids))
            room -= len(ids)
        first = task + [i for index, ids in kept if index < shared for i in ids]
        return first, [i for index, ids in kept if index >= shared for i in ids] + header

    def check_tokenizer(self, agent: str, policy: Any) -> None:
        """Refuse an agent whose tokenizer differs from the critic's: its completion ids would mean other tokens."""
        if policy is self.policy or policy.tokenizer is self.policy.tokenizer:
            return
        if policy.tokenizer.get_vocab() != self.policy.tokenizer.get_vocab():
            raise ValueError(
                f"{agent}'s model {policy.name!r} has a different tokenizer from the critic's base "
                f"{self.policy.name!r}: "
                "the centralized critic reads every agent's completion token ids, so a team of models with different "
                "vocabularies cannot share it. Use models with one tokenizer (e.g. fine-tunes of one base), or MAGRPO, "
                "which has no critic."
            )

    def values(
        self, context_ids: Sequence[list[int]], completion_ids: Sequence[list[int]],
        trunk: Sequence[torch.Tensor] | None = None, prefix_ids: Sequence[list[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``V_k`` for every completion token ``[B, L]`` (right-padded) and its mask; differentiable.

        ``trunk``: each row's :meth:`trunk` states, so that only the adapted layers run (needs ``layers``).
        ``prefix_ids``: each row's context starts with these tokens (the task and earlier turns,
        :meth:`split_context_ids`) and ``context_ids`` holds only the rest; rows that share a prefix run it once.
        """
        if prefix_ids is not None:
            if trunk is not None:
                raise ValueError("give trunk states or shared context prefixes, not both")
            return self._values_after_prefixes(prefix_ids, context_ids, completion_ids)
        if trunk is None and self.depth < len(self._decoder().layers):     # the decoder's own output, normed
            with self.policy.using(self.adapter), self._layers(0, self.depth):
                states, width, completion_mask = self.policy.completion_hidden(context_ids, completion_ids)
            return self.head(states.float()).squeeze(-1) * completion_mask, completion_mask
        if trunk is None:
            with self.policy.using(self.adapter):
                out, width, completion_mask = self.policy.completion_forward(
                    context_ids, completion_ids, output_hidden_states=True
                )
            hidden = out.hidden_states[-1]
        else:
            if not self.first_layer:
                raise ValueError("trunk states need a critic whose adapter leaves the lower layers frozen (layers=k)")
            ids, mask, width = self.policy.scoring_rows(context_ids, completion_ids)
            real = mask.bool()
            dtype = self._decoder().norm.weight.dtype
            states = torch.cat([t.to(self.policy.device, dtype) for t in trunk])
            if states.shape[0] != int(real.sum()):
                raise ValueError(f"trunk states hold {states.shape[0]} positions, the rows {int(real.sum())}")
            embeds = states.new_zeros(*ids.shape, states.shape[-1])
            embeds[real.to(embeds.device)] = states
            mask = mask.to(self.policy.device)
            with self.policy.using(self.adapter), self._layers(self.first_layer, self.depth):
                hidden = self._decoder()(inputs_embeds=embeds, attention_mask=mask,
                                         position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                                         use_cache=False).last_hidden_state
            completion_mask = mask[:, -width:]
        hidden = hidden[:, -(width + 1):-1, :].float()     # state before each completion token
        return self.head(hidden).squeeze(-1) * completion_mask, completion_mask

    def _values_after_prefixes(self, prefix_ids: Sequence[list[int]], context_ids: Sequence[list[int]],
                               completion_ids: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`values` of rows ``prefix + context + completion``, each distinct prefix run once."""
        if not (len(prefix_ids) == len(context_ids) == len(completion_ids)) or not prefix_ids:
            raise ValueError(f"need one prefix, context and completion per row, got {len(prefix_ids)}, "
                             f"{len(context_ids)} and {len(completion_ids)}")
        if any(not p for p in prefix_ids):
            raise ValueError("every shared context prefix needs at least one token")
        if getattr(self.policy, "lockstep", False):   # sharded weights: every process makes the same forward calls
            return self.values([list(p) + list(c) for p, c in zip(prefix_ids, context_ids)], completion_ids)
        rows = [list(c) + list(x) for c, x in zip(context_ids, completion_ids)]
        with self.policy.using(self.adapter), self._layers(0, self.depth):
            hidden, _, _ = self.policy.completion_hidden(prefix_ids, rows)   # [B, W, d]: the state before token k
        length = max(1, max(len(x) for x in completion_ids))
        at = torch.tensor([[len(c) + min(k, max(len(x) - 1, 0)) for k in range(length)]
                           for c, x in zip(context_ids, completion_ids)], device=hidden.device)
        states = hidden.gather(1, at[..., None].expand(-1, -1, hidden.shape[-1])).float()
        mask = torch.tensor([[1] * len(x) + [0] * (length - len(x)) for x in completion_ids], device=hidden.device)
        return self.head(states).squeeze(-1) * mask, mask

    @torch.no_grad()
    def trunk(self, context_ids: Sequence[list[int]], completion_ids: Sequence[list[int]]) -> list[torch.Tensor]:
        """Each row's hidden states ``[context + completion tokens, d]`` entering the first adapted layer.

        The layers below it are the frozen base's, so these states stay valid while the critic trains: a step
        computes them once and every :meth:`values` call of the step starts from them.
        """
        if not self.first_layer:
            raise ValueError("the critic adapts every layer (layers=None): there is no frozen trunk to run once")
        ids, mask, _ = self.policy.scoring_rows(context_ids, completion_ids)
        ids, mask = ids.to(self.policy.device), mask.to(self.policy.device)
        decoder, captured = self._decoder(), []
        hook = decoder.norm.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
        try:
            with self.policy.using(None), self._layers(0, self.first_layer):
                decoder(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                        use_cache=False)
        finally:
            hook.remove()
        states = captured[-1][mask.bool()].cpu()
        return list(torch.split(states, [len(c) + len(x) for c, x in zip(context_ids, completion_ids)]))

    def _decoder(self) -> Any:
        """The base model's decoder stack (``.layers``, ``.norm``)."""
        base = self.policy.model.get_base_model()
        return base.get_decoder()

    def _linear_names(self) -> list[str]:
        """The names of a decoder layer's linear modules (what ``"all-linear"`` adapts, named one by one)."""
        names = set()
        for name, module in self._decoder().layers[0].named_modules():
            if hasattr(module, "base_layer"):                 # already wrapped by the agents' adapters
                names.add(name.split(".")[-1])
            elif isinstance(module, torch.nn.Linear) and not any(k in name for k in ("lora_", "base_layer")):
                names.add(name.split(".")[-1])
        return sorted(names)

    def _depth(self, depth: int | None) -> int:
        """How many of the base's decoder layers the critic runs (all when ``depth`` is None)."""
        decoder = self._decoder()
        if depth is None:
            return len(decoder.layers) if hasattr(decoder, "layers") else 0
        self._require_layer_stack(f"critic depth={depth}", "depth=None")
        total = len(decoder.layers)
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= total:
            raise ValueError(f"critic depth must be an int in [1, {total}] for a {total}-layer model, got {depth!r}")
        return depth

    def _first_adapted_layer(self, layers: int | None) -> int:
        """Index of the lowest layer the adapter adapts (0: every layer the critic runs)."""
        if layers is None:
            return 0
        self._require_layer_stack(f"critic layers={layers}", "layers=None")
        if not 1 <= layers <= self.depth:
            raise ValueError(f"critic layers must be in [1, {self.depth}] for a critic that runs {self.depth} "
                             f"layers, got {layers}")
        return self.depth - layers

    def _require_layer_stack(self, setting: str, instead: str) -> None:
        decoder = self._decoder()
        if not (hasattr(decoder, "layers") and hasattr(decoder, "norm")):
            raise ValueError(f"{setting} needs a decoder with .layers and .norm (Llama-style); "
                             f"{type(decoder).__name__} has not both; use {instead}")

    @contextlib.contextmanager
    def _layers(self, start: int, stop: int | None):
        """Run the decoder over ``layers[start:stop]`` only (the others are skipped) inside the block."""
        decoder = self._decoder()
        every = getattr(decoder, "layers", None)
        if every is None or (start == 0 and stop in (None, len(every))):    # the whole stack: nothing to swap
            yield
            return
        decoder.layers = torch.nn.ModuleList(list(every)[start:stop])
        try:
            yield
        finally:
            decoder.layers = every

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The critic adapter's LoRA weights and the value head."""
        return self.policy.trainable_parameters(self.adapter) + list(self.head.parameters())

    def trainable_state_dict(self, whole: bool = True) -> dict[str, torch.Tensor]:
        """What a checkpoint holds for the critic (``whole``: see ``HFPolicy.trainable_state_dict``)."""
        state = {f"adapter.{k}": v for k, v in self.policy.trainable_state_dict(self.adapter, whole=whole).items()}
        state.update({f"head.{k}": v.detach().clone() for k, v in self.head.state_dict().items()})
        return state

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Inverse of :meth:`trainable_state_dict`."""
        self.policy.load_trainable_state_dict(
            self.adapter, {k[len("adapter."):]: v for k, v in state.items() if k.startswith("adapter.")})
        self.head.load_state_dict({k[len("head."):]: v for k, v in state.items() if k.startswith("head.")})


__all__ = ["critic_context", "critic_context_parts", "critic_task_text", "CentralizedCritic"]
