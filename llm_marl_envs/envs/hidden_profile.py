"""# Hidden profile

Two recruiters must pick the one candidate, of five, who meets every requirement. Each holds
private facts ("Ana speaks Spanish.", "Ben cannot work weekends."), and each one's facts favour a
wrong candidate: the one they confirm on the most requirements, whose failing requirement only the
other recruiter knows. Only the union of the facts rules out every wrong candidate (the hidden
profile of group decision research, HiddenBench, arXiv 2505.11556). Follows the protocol of
`llm_marl_envs.envs.information_split`: at turn 0 each tells the other what it knows, at the last
turn both answer with the candidate's letter (or name).

| Import | `llm_marl_envs.make("hidden_profile-v0")` |
|---|---|
| Agents | `agent_0`, `agent_1` (the two recruiters); 1 or 2 with `view="own"`/`"full"` |
| Turns | 2 by default: turn 0 tell your partner, turn 1 answer |
| Action space | `TextSpace(max_action_chars)`: a message; at the last turn an answer ending in `\\boxed{letter}` |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | procedural, offline: 5 named candidates, `num_requirements` requirements, facts split between the recruiters |
| Verifier | `verifiers.choice.verify_choice` against the right candidate's letter (its name counts too) |
| Reward | per agent: 1.0 if its last-turn choice is right, else `format_reward` (default 0.0) if the verifier read an answer, else 0.0; 0 at earlier turns |

### Arguments

```python
llm_marl_envs.make("hidden_profile-v0", num_agents=2, num_turns=2, view="split", seat=None,
                   mask_messages=False, format_reward=0.0, split="test", num_tasks=500, num_requirements=4,
                   max_action_chars=8192, render_mode=None, data_dir=None)
```

`num_requirements`: requirements per task, 3..6, drawn from a pool of ten ("speaks Spanish",
"can work weekends", ...). Every task states that exactly one candidate meets all of them.

How a task is built. The five candidates are the right one and, per recruiter k, a *favourite*
f_k and a *look-alike* u_k, each failing one requirement. Recruiter k is told that f_k meets every
requirement but its failing one (so f_k looks best to it), and the same number of met requirements
(1 .. `num_requirements` - 2, drawn per task) for the right candidate and for u_k; it is told the
failing requirement of the other recruiter's favourite and look-alike. So each recruiter's facts
rule out two candidates and leave three possible (its favourite, the right one and its
look-alike), while the union rules out all four wrong ones. The look-alikes are what keeps a lone
recruiter from winning by a rule such as "never pick my favourite": in its view the right
candidate and its look-alike have the same kind of facts, so no rule beats a coin toss between
them. (With three or four candidates some recruiter's view would leave only its favourite and
the right one.) Letters, names, requirements and the order of the facts are drawn at random.

`view`, `seat`, `mask_messages`, `format_reward`, `num_tasks`, `split`: as in every information-split env
(`llm_marl_envs.envs.information_split`): tasks are assigned to a split by a hash of the
candidates, requirements and facts; the remaining arguments are those of every env
(`llm_marl_envs.core`); `data_dir` is unused.

### Version History

* v0: initial release
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import Any

import numpy as np

from verifiers import Verdict
from verifiers.choice import LETTERS, verify_choice

from ..data import Record
from .information_split import InformationSplitEnv

# requirement -> (what the task statement says, a met fact, a failed fact); "{}" is the candidate's name
REQUIREMENTS = (
    ("speaks Spanish", "{} speaks Spanish.", "{} does not speak Spanish."),
    ("holds a driving licence", "{} holds a driving licence.", "{} has no driving licence."),
    ("can work weekends", "{} can work weekends.", "{} cannot work weekends."),
    ("has first-aid training", "{} has first-aid training.", "{} has no first-aid training."),
    ("can start this month", "{} can start this month.", "{} cannot start before next month."),
    ("has a university degree", "{} has a university degree.", "{} has no university degree."),
    ("has managed a team before", "{} has managed a team before.", "{} has never managed a team."),
    ("is available full time", "{} is available full time.", "{} is only available part time."),
    ("lives in the city", "{} lives in the city.", "{} lives outside the city."),
    ("knows accounting software", "{} knows accounting software.", "{} does not know accounting software."),
)
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Luca", "Maya",
         "Nils", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wes", "Yara", "Zoe", "Arjun",
         "Bianca", "Carlos", "Dana", "Emil")
NUM_CANDIDATES = 5        # the right one, and a favourite and a look-alike per recruiter
MIN_REQUIREMENTS, MAX_REQUIREMENTS = 3, 6


class HiddenProfileEnv(InformationSplitEnv):
    """Each recruiter's facts favour a wrong candidate; only their union identifies the right one."""

    metadata = {**InformationSplitEnv.metadata, "name": "hidden_profile-v0"}
    data_source = "procedural hidden profiles: 5 candidates, split facts (offline)"
    verifier_name = "verifiers.choice.verify_choice"
    role_names = ("first recruiter", "second recruiter")
    answer_instruction = "Give the letter of the candidate who meets every requirement in \\boxed{}."

    def __init__(self, *, num_requirements: int = 4, **kwargs: Any) -> None:
        if not isinstance(num_requirements, int) or isinstance(num_requirements, bool) \
                or not MIN_REQUIREMENTS <= num_requirements <= MAX_REQUIREMENTS:
            raise ValueError(f"num_requirements must be an int in [{MIN_REQUIREMENTS}, {MAX_REQUIREMENTS}], got "
                             f"{num_requirements!r}")
        super().__init__(**kwargs)
        self.num_requirements = num_requirements

    # -- the task
    def draw_task(self, rng: np.random.Generator) -> Record:
        r = self.num_requirements
        names = [NAMES[i] for i in rng.choice(len(NAMES), size=NUM_CANDIDATES, replace=False)]
        requirements = sorted(int(i) for i in rng.choice(len(REQUIREMENTS), size=r, replace=False))
        right, *wrong = (int(i) for i in rng.permutation(NUM_CANDIDATES))
        favourites, look_alikes = wrong[:2], wrong[2:]
        fails = {c: int(rng.integers(r)) for c in wrong}              # the one requirement each wrong one fails
        facts: list[list[list[Any]]] = [[], []]                       # per role: [candidate, requirement, met]
        for k in range(2):
            other = 1 - k
            facts[k] += [[favourites[k], q, True] for q in range(r) if q != fails[favourites[k]]]
            shown = int(rng.integers(1, r - 1))                       # met requirements told for right and u_k
            facts[k] += [[right, int(q), True] for q in rng.choice(r, size=shown, replace=False)]
            met = [q for q in range(r) if q != fails[look_alikes[k]]]
            facts[k] += [[look_alikes[k], int(q), True] for q in rng.choice(met, size=shown, replace=False)]
            facts[k] += [[c, fails[c], False] for c in (favourites[other], look_alikes[other])]
            facts[k] = [facts[k][i] for i in rng.permutation(len(facts[k]))]
        return {"candidates": names, "requirements": requirements, "facts": facts, "answer": LETTERS[right],
                "favourites": [LETTERS[c] for c in favourites], "look_alikes": [LETTERS[c] for c in look_alikes]}

    def task_content(self, task: Record) -> str:
        return "; ".join([*task["candidates"], *map(str, task["requirements"]),
                          *(self.fact_text(task, fact) for role_facts in task["facts"] for fact in role_facts)])

    def fact_text(self, task: Record, fact: list[Any]) -> str:
        """A ``[candidate, requirement, met]`` fact as a sentence."""
        candidate, requirement, met = fact
        _, met_text, failed_text = REQUIREMENTS[task["requirements"][requirement]]
        return (met_text if met else failed_text).format(task["candidates"][candidate])

    def task_statement(self, task: Record) -> str:
        wanted = "\n".join(f"{i + 1}. The candidate {REQUIREMENTS[q][0]}." for i, q in enumerate(task["requirements"]))
        candidates = ", ".join(f"{LETTERS[i]}. {name}" for i, name in enumerate(task["candidates"]))
        return (f"Your team is hiring one person. The requirements:\n{wanted}\nThe candidates: {candidates}. "
                "Exactly one candidate meets every requirement; your team must find which. Every fact below is "
                "true; anything not stated is unknown.")

    def view_text(self, task: Record, role: int) -> str:
        return "\n".join(f"- {fact}" for fact in self.private_facts(task, role))

    def private_facts(self, task: Record, role: int) -> list[str]:
        return [self.fact_text(task, fact) for fact in task["facts"][role]]

    @property
    def chance_accuracy(self) -> float:
        return 1 / NUM_CANDIDATES

    def verify(self, response: str, task: Record) -> Verdict:
        return verify_choice(response, task["answer"], len(task["candidates"]), names=task["candidates"])

    def consistent_answers(self, task: Record, roles: Collection[int]) -> set[str]:
        known = {(c, q): met for role in roles for c, q, met in task["facts"][role]}
        r = len(task["requirements"])
        rows = [[row for row in itertools.product((True, False), repeat=r)
                 if all(known.get((c, q), value) == value for q, value in enumerate(row))]
                for c in range(len(task["candidates"]))]
        return {LETTERS[x] for x in range(len(rows))
                if (True,) * r in rows[x] and all(any(not all(row) for row in rows[y]) for y in range(len(rows))
                                                  if y != x)}
