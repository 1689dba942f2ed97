"""# Reference game

A speaker and a listener see the same `num_candidates` objects ("red small circle", "blue small
star", ...). The speaker knows which one is the target; the listener sees the objects lettered in
an order only it knows. Both must name the target's letter in the listener's list, following the
protocol of `llm_marl_envs.envs.information_split`: at turn 0 each tells the other what it
knows (the speaker describes the target, the listener can read out its list), at the last turn
both answer. Neither view determines the letter: the speaker does not know the lettering, and
for the listener every object could be the target.

| Import | `llm_marl_envs.make("reference_game-v0")` |
|---|---|
| Agents | `agent_0` (speaker), `agent_1` (listener); 1 or 2 with `view="own"`/`"full"` |
| Turns | 2 by default: turn 0 tell your partner, turn 1 answer |
| Action space | `TextSpace(max_action_chars)`: a message; at the last turn an answer ending in `\\boxed{letter}` |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | procedural, offline: scenes of attribute tuples (colour, size, shape, pattern) |
| Verifier | `verifiers.choice.verify_choice` against the target's letter (letters only: naming the object is not an answer) |
| Reward | per agent: 1.0 if its last-turn letter is the target's, else `format_reward` (default 0.0) if the verifier read an answer, else 0.0; 0 at earlier turns |

### Arguments

```python
llm_marl_envs.make("reference_game-v0", num_agents=2, num_turns=2, view="split", seat=None,
                   mask_messages=False, format_reward=0.0, split="test", num_tasks=500, num_candidates=4, num_attributes=3,
                   letter_position="before", max_action_chars=8192, render_mode=None, data_dir=None)
```

`num_candidates`: objects per scene, 2..8 (letters `A`..`H`).

`num_attributes`: attributes per object: 2 (colour, shape), 3 (colour, size, shape: "red small
circle") or 4 (pattern first: "striped red small circle").

`letter_position`: where the listener's list puts each letter: `"before"` the object ("B. red
circle") or `"after"` it ("red circle (B)"). With `"after"`, the last turn asks each agent to repeat
the target's line from the listener's list before it answers: the letter is then the text that
follows words it has just written, which a small model can copy. The information each view holds is
the same either way.

A scene is drawn around a base object: every other object changes one or two of its attributes,
so objects share attributes and the speaker must say enough to single the target out; the target
is then drawn uniformly from the scene (the base is no likelier than the others), and the
listener's lettering is a uniform random order. The speaker sees the objects in alphabetical
order, which says nothing about the lettering.

`view`, `seat`, `mask_messages`, `format_reward`, `num_tasks`, `split`: as in every information-split env
(`llm_marl_envs.envs.information_split`): tasks are assigned to a split by a hash of the scene (the
set of objects), so a scene of one split never appears in the other with another target or order;
the remaining arguments are those of every env (`llm_marl_envs.core`); `data_dir` is unused.

### Version History

* v0: initial release
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import Any

import numpy as np

from verifiers import Verdict
from verifiers.choice import LETTERS, MAX_CHOICES, verify_choice

from ..data import Record
from .information_split import InformationSplitEnv

PATTERNS = ("striped", "dotted", "plain", "checked")
COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white")
SIZES = ("small", "medium", "large")
SHAPES = ("circle", "square", "triangle", "star", "heart", "diamond")
ATTRIBUTES = {2: (COLOURS, SHAPES), 3: (COLOURS, SIZES, SHAPES), 4: (PATTERNS, COLOURS, SIZES, SHAPES)}
DRAWS_PER_OBJECT = 100
LETTER_POSITIONS = ("before", "after")


class ReferenceGameEnv(InformationSplitEnv):
    """The speaker knows the target, the listener the lettering; both must answer the target's letter."""

    metadata = {**InformationSplitEnv.metadata, "name": "reference_game-v0"}
    data_source = "procedural attribute scenes (offline)"
    verifier_name = "verifiers.choice.verify_choice"
    role_names = ("speaker", "listener")

    def __init__(self, *, num_candidates: int = 4, num_attributes: int = 3, letter_position: str = "before",
                 **kwargs: Any) -> None:
        if not isinstance(num_candidates, int) or isinstance(num_candidates, bool) \
                or not 2 <= num_candidates <= MAX_CHOICES:
            raise ValueError(f"num_candidates must be an int in [2, {MAX_CHOICES}], got {num_candidates!r}")
        if num_attributes not in ATTRIBUTES or isinstance(num_attributes, bool):
            raise ValueError(f"num_attributes must be one of {sorted(ATTRIBUTES)}, got {num_attributes!r}")
        if letter_position not in LETTER_POSITIONS:
            raise ValueError(f"letter_position must be one of {list(LETTER_POSITIONS)}, got {letter_position!r}")
        super().__init__(**kwargs)
        self.num_candidates = num_candidates
        self.num_attributes = num_attributes
        self.letter_position = letter_position
        letters = f"({LETTERS[0]}-{LETTERS[num_candidates - 1]})"
        if letter_position == "after":      # the line repeated ends in the letter: copying it is the lookup
            self.answer_instruction = f"Repeat the target's line from the listener's list, then give its letter " \
                                      f"{letters} in \\boxed{{}}."
        else:
            self.answer_instruction = f"Give the target's letter in the listener's list {letters} in \\boxed{{}}."

    # -- the task
    def draw_task(self, rng: np.random.Generator) -> Record:
        attributes = ATTRIBUTES[self.num_attributes]
        base = tuple(int(rng.integers(len(values))) for values in attributes)
        scene = [base]
        for _ in range(DRAWS_PER_OBJECT * self.num_candidates):
            if len(scene) == self.num_candidates:
                break
            other = list(base)
            for position in rng.choice(len(attributes), size=int(rng.integers(1, 3)), replace=False):
                other[position] = int(rng.integers(len(attributes[position])))
            if tuple(other) not in scene:
                scene.append(tuple(other))
        if len(scene) < self.num_candidates:        # cannot happen with the attribute lists above; say so if it does
            raise ValueError(f"could not draw {self.num_candidates} distinct objects around {base}")
        objects = [" ".join(values[i] for values, i in zip(attributes, item)) for item in scene]
        target = objects[int(rng.integers(len(objects)))]
        order = [objects[i] for i in rng.permutation(len(objects))]
        return {"objects": order, "target": target, "answer": LETTERS[order.index(target)]}

    def task_content(self, task: Record) -> str:
        return "; ".join(sorted(task["objects"]))

    def task_statement(self, task: Record) -> str:
        k = len(task["objects"])
        return (f"Your team plays a reference game with {k} objects. One of them is the target. The speaker knows "
                f"which object is the target; the listener sees the objects lettered {LETTERS[0]} to "
                f"{LETTERS[k - 1]} in an order only it knows. Both must name the target's letter in the listener's "
                "list.")

    def view_text(self, task: Record, role: int) -> str:
        if role == 0:
            listing = "\n".join(f"- {obj}" for obj in sorted(task["objects"]))
            return f"The objects (in alphabetical order):\n{listing}\n{self._target_line(task)}."
        return "The objects, lettered:\n" + "\n".join(self._lettered(task))

    @staticmethod
    def _target_line(task: Record) -> str:
        return f"The target is the {task['target']}"

    def private_facts(self, task: Record, role: int) -> list[str]:
        if role == 0:
            return [self._target_line(task)]
        return self._lettered(task)

    def _lettered(self, task: Record) -> list[str]:
        """The listener's list, one line per object, its letter before or after it (``letter_position``)."""
        if self.letter_position == "after":
            return [f"{obj} ({LETTERS[i]})" for i, obj in enumerate(task["objects"])]
        return [f"{LETTERS[i]}. {obj}" for i, obj in enumerate(task["objects"])]

    @property
    def chance_accuracy(self) -> float:
        return 1 / self.num_candidates

    def verify(self, response: str, task: Record) -> Verdict:
        return verify_choice(response, task["answer"], len(task["objects"]))

    def consistent_answers(self, task: Record, roles: Collection[int]) -> set[str]:
        objects = task["objects"]
        orders = [objects] if 1 in roles else itertools.permutations(objects)
        targets = [task["target"]] if 0 in roles else objects
        return {LETTERS[list(order).index(target)] for order in orders for target in targets}
