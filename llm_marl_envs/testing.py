"""Reusable compliance checks for text environments, in the spirit of ``pettingzoo.test``.

``text_env_api_test(env_fn)`` runs PettingZoo's ``parallel_api_test`` and
``parallel_seed_test`` on the env and then the checks this library promises on top of them:
text observations equal to the rendered chat messages, the infos keys, task pinning through
``reset(options=...)``, independent clones, and clear ``ValueError`` on bad input (non-string,
missing or unknown agent, a step after the end) with huge actions truncated rather than hung on.
Call it on any env, built in or your own::

    from llm_marl_envs.testing import text_env_api_test
    text_env_api_test(lambda: llm_marl_envs.make("gsm8k_debate-v0"))

``held_out_test(train_env, test_env)`` checks that two splits are a held-out pair: both non-empty
and no task of one in the other, compared by content (:func:`task_text`), not by id.

``information_split_test(env_fn)`` checks an information-split env
(:class:`~llm_marl_envs.envs.information_split.InformationSplitEnv`): no prompt ever holds a private
fact of a view its agent lacks, masked partners' messages never reach a prompt, the full view holds
every view, and, by its brute-force solver, all views together determine the gold answer; it returns
the share of tasks each view alone leaves undetermined (:func:`undetermined_shares`)::

    information_split_test(lambda **kwargs: llm_marl_envs.make("split_arithmetic-v0", **kwargs))
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable

from pettingzoo.test import parallel_api_test, parallel_seed_test

from .core import TextEnv, render_messages
from .data import Record, canonical_text
from .envs.information_split import InformationSplitEnv

INFO_KEYS = {"turn", "task_id", "verdict", "messages", "scores", "correct", "action_truncated"}


def _expect_value_error(fn: Callable[[], object], what: str) -> None:
    try:
        fn()
    except ValueError as err:
        if not str(err):
            raise AssertionError(f"{what}: ValueError without a message") from err
        return
    raise AssertionError(f"{what}: expected ValueError, none raised")


def _short_actions(env: TextEnv, text: str = "42") -> dict[str, str]:
    return {agent: text for agent in env.agents}


def check_observations_and_infos(env: TextEnv) -> None:
    """Observations are the rendered messages in infos; infos carry the documented keys."""
    obs, infos = env.reset(seed=3)
    while True:
        assert set(obs) == set(infos), "observations and infos must name the same agents"
        for agent in obs:
            missing = INFO_KEYS - set(infos[agent])
            assert not missing, f"infos[{agent!r}] lacks {sorted(missing)}"
            assert obs[agent] == render_messages(infos[agent]["messages"]), "obs must render infos['messages']"
            assert env.observation_space(agent).contains(obs[agent])
        if not env.agents:
            return
        obs, _, _, _, infos = env.step(_short_actions(env))


def check_task_pinning_and_clone(env: TextEnv) -> None:
    """``task_index`` and ``task`` options pin the task; clones evolve independently."""
    _, infos = env.reset(seed=0, options={"task_index": 1})
    first = infos[env.agents[0]]["task_id"]
    _, infos = env.reset(seed=123, options={"task_index": 1})
    assert infos[env.agents[0]]["task_id"] == first, "task_index must pin the task whatever the seed"
    record = dict(env.task)
    _, infos = env.reset(options={"task": record})
    assert infos[env.agents[0]]["task_id"] == record["task_id"]
    _expect_value_error(lambda: env.reset(options={"task_index": len(env.tasks)}), "task_index out of range")

    env.reset(seed=0)
    twin = env.clone()
    env.step(_short_actions(env, "1"))
    assert twin.turn == 0 and not twin.answers, "stepping the original must not change its clone"
    twin.step(_short_actions(twin, "2"))
    assert env.answers[0] != twin.answers[0]


def check_bad_input(env: TextEnv) -> None:
    """Bad actions raise ``ValueError`` with a message; huge actions are truncated, not hung on."""
    _expect_value_error(lambda: env.step(_short_actions(env)), "step before reset")
    env.reset(seed=0)
    agents = list(env.agents)
    _expect_value_error(lambda: env.step("42"), "actions not a dict")
    _expect_value_error(lambda: env.step({a: 42 for a in agents}), "non-string action")
    _expect_value_error(lambda: env.step({a: None for a in agents}), "None action")
    if len(agents) > 1:
        _expect_value_error(lambda: env.step({agents[0]: "42"}), "missing agent")
    _expect_value_error(lambda: env.step({**_short_actions(env), "agent_99": "42"}), "unknown agent")
    _expect_value_error(lambda: env.observation_space("agent_99"), "unknown agent space")
    assert env.turn == 0, "a refused step must not change the episode"

    huge = "9" * 1_000_000
    _, _, _, _, infos = env.step({a: huge for a in agents})
    for agent in agents:
        if agent in infos:
            assert infos[agent]["action_truncated"], "a 1 MB action must be reported as truncated"
    while env.agents:
        env.step(_short_actions(env))
    _expect_value_error(lambda: env.step({a: "42" for a in agents}), "step after the episode ended")


# PettingZoo's API test calls reset(seed=0, options={"options": 1}) only to check that reset takes an
# `options` argument; the env's warning about that unknown key is noise there (and only there).
PROBE_OPTION_WARNING = r"(?s).*ignoring unknown reset option\(s\) \['options'\]"


def text_env_api_test(env_fn: Callable[[], TextEnv], num_cycles: int = 20) -> None:
    """Run PettingZoo's parallel API and seed tests plus this library's text-env checks."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PROBE_OPTION_WARNING)
        parallel_api_test(env_fn(), num_cycles=num_cycles)
        parallel_seed_test(env_fn, num_cycles=num_cycles)
    check_observations_and_infos(env_fn())
    check_task_pinning_and_clone(env_fn())
    check_bad_input(env_fn())


def task_text(env: TextEnv, task: Record) -> str:
    """What makes two tasks the same: the canonical text of every agent's opening messages for ``task``.

    Every agent's, not agent 0's alone: where agents hold different parts of a task (the
    information-split envs), one agent's part recurs across tasks that differ in the others'.
    """
    return canonical_text("\n".join(m["content"] for i in range(len(env.possible_agents))
                                     for m in env.first_prompt(i, task)))


def held_out_test(train_env: TextEnv, test_env: TextEnv) -> None:
    """Both envs have tasks and ``test_env`` has none whose content is also a task of ``train_env``."""
    for env in (train_env, test_env):
        if not env.tasks:
            raise AssertionError(f"{env.metadata['name']} split {env.split!r} has no tasks")
    seen = {task_text(train_env, task) for task in train_env.tasks}
    shared = [task.get("task_id") for task in test_env.tasks if task_text(test_env, task) in seen]
    if shared:
        raise AssertionError(f"{test_env.metadata['name']}: {len(shared)} of {len(test_env.tasks)} tasks of split "
                             f"{test_env.split!r} are also in split {train_env.split!r}, e.g. {shared[:5]}")


# ----------------------------------------------------------------------------- information-split envs
def mentions(text: str, fact: str) -> bool:
    """Whether ``text`` holds ``fact``, case-insensitively (as a whole word at an end that is a letter or digit)."""
    left = r"(?<!\w)" if fact[:1].isalnum() else ""
    right = r"(?!\w)" if fact[-1:].isalnum() else ""
    return re.search(left + re.escape(fact) + right, text, re.IGNORECASE) is not None


def undetermined_shares(env: InformationSplitEnv) -> dict[str, float]:
    """Per role: the share of ``env.tasks`` its view alone leaves with >= 2 answers (the env's brute-force solver).

    Raises ``AssertionError`` on a task whose views together allow anything but its gold answer.
    """
    roles = range(len(env.role_names))
    undetermined = dict.fromkeys(env.role_names, 0)
    for task in env.tasks:
        together = env.consistent_answers(task, roles)
        if together != {task["answer"]}:
            raise AssertionError(f"{task['task_id']}: all views together allow {sorted(together)}, not only the gold "
                                 f"answer {task['answer']!r}")
        for role in roles:
            undetermined[env.role_names[role]] += len(env.consistent_answers(task, [role])) >= 2
    return {name: count / len(env.tasks) for name, count in undetermined.items()}


def leaked_facts(env: InformationSplitEnv, agent: str, texts: Iterable[str]) -> list[str]:
    """Private facts of the roles whose views ``agent`` lacks that appear in ``texts``.

    Facts that the agent's own private facts or the task statement also hold are not counted.
    """
    task, mine = env.task, env.agent_roles(env.agent_index(agent))
    allowed = "\n".join([env.task_statement(task), *(fact for role in mine for fact in env.private_facts(task, role))])
    others = {fact for role in range(len(env.role_names)) if role not in mine
              for fact in env.private_facts(task, role) if not mentions(allowed, fact)}
    texts = list(texts)
    return sorted(fact for fact in others if any(mentions(text, fact) for text in texts))


def _prompt_texts(obs: dict[str, str], infos: dict[str, dict], agent: str) -> list[str]:
    """Everything an agent is shown: its observation and the contents of its info messages."""
    return [obs[agent], *(m["content"] for m in infos[agent]["messages"])]


def _play_checking(env: InformationSplitEnv, task_index: int, actions: Callable[[str, int], str],
                   check: Callable[[str, list[str]], None]) -> None:
    """Play one episode on a pinned task, calling ``check(agent, texts)`` on every agent's prompt at every turn."""
    obs, infos = env.reset(seed=task_index, options={"task_index": task_index})
    while True:
        for agent in obs:
            check(agent, _prompt_texts(obs, infos, agent))
        if not env.agents:
            return
        obs, _, _, _, infos = env.step({agent: actions(agent, env.turn) for agent in env.agents})


def check_views_do_not_leak(env_fn: Callable[..., InformationSplitEnv], task_indices: Iterable[int]) -> None:
    """No prompt, at any turn, holds a private fact of a view its agent lacks (actions that repeat nothing).

    Checked for one agent per seat (``view="own", num_agents=1``), every role alone side by side
    (``view="own"``) and the team (``view="split"``). The full view must hold every view's facts.
    """
    probe = env_fn()
    roles = len(probe.role_names)
    layouts = [{"view": "own", "num_agents": 1, "seat": seat} for seat in range(roles)]
    layouts += [{"view": "own", "num_agents": roles}, {"view": "split", "num_agents": roles}]
    task_indices = list(task_indices)
    for layout in layouts:
        env = env_fn(**layout)

        def no_leak(agent: str, texts: list[str], env=env, layout=layout) -> None:
            leaked = leaked_facts(env, agent, texts)
            if leaked:
                raise AssertionError(f"{layout}: the prompt of {agent} on task {env.task['task_id']} holds the "
                                     f"private facts {leaked} of a view it lacks")
        for index in task_indices:
            _play_checking(env, index, lambda agent, turn: "ok", no_leak)
    full = env_fn(view="full", num_agents=1)
    for index in task_indices:
        obs, _ = full.reset(options={"task_index": index})
        missing = [fact for role in range(roles) for fact in full.private_facts(full.task, role)
                   if not mentions(obs["agent_0"], fact)]
        if missing:
            raise AssertionError(f"view='full' lacks the facts {missing} on task {full.task['task_id']}")


def check_masked_messages(env_fn: Callable[..., InformationSplitEnv], task_indices: Iterable[int]) -> None:
    """With ``mask_messages=True`` a partner's text never reaches a prompt; without it, it does.

    Every agent tells everything it knows plus a marker naming itself and the turn; with the mask no
    other agent's observation or info messages hold a marker or a fact of a view it lacks.
    """
    marker = "MARKER-{}-T{}"

    def tell_all(env: InformationSplitEnv) -> Callable[[str, int], str]:
        def action(agent: str, turn: int) -> str:
            views = [env.view_text(env.task, role) for role in env.agent_roles(env.agent_index(agent))]
            return "\n".join([*views, marker.format(agent, turn)])
        return action

    masked, plain = env_fn(mask_messages=True), env_fn()
    for index in task_indices:
        def nothing_arrives(agent: str, texts: list[str]) -> None:
            others = [marker.format(a, t) for a in masked.possible_agents if a != agent
                      for t in range(masked.num_turns)]
            seen = [m for m in others if any(m in text for text in texts)]
            leaked = leaked_facts(masked, agent, texts)
            if seen or leaked:
                raise AssertionError(f"mask_messages=True: the prompt of {agent} on task {masked.task['task_id']} "
                                     f"holds its partners' text ({seen}, facts {leaked})")
        _play_checking(masked, index, tell_all(masked), nothing_arrives)
        _play_checking(plain, index, tell_all(plain), lambda agent, texts: None)
        last_prompt = plain.messages["agent_0"][-2]["content"]        # the user message before its last answer
        if plain.num_turns > 1 and marker.format("agent_1", plain.num_turns - 2) not in last_prompt:
            raise AssertionError("without mask_messages agent_1's message must reach agent_0's next prompt")


def information_split_test(env_fn: Callable[..., InformationSplitEnv], num_tasks: int = 10) -> dict[str, float]:
    """Leak, masking and full-view checks on the first ``num_tasks`` tasks, then :func:`undetermined_shares`.

    ``env_fn(**overrides)`` builds the env with the given keyword arguments (``view``, ``num_agents``,
    ``seat``, ``mask_messages``). Returns the share of the default env's tasks each role's view leaves
    undetermined.
    """
    env = env_fn()
    if not isinstance(env, InformationSplitEnv):
        raise AssertionError(f"{type(env).__name__} is not an InformationSplitEnv")
    tasks = range(min(num_tasks, len(env.tasks)))
    check_views_do_not_leak(env_fn, tasks)
    check_masked_messages(env_fn, tasks)
    return undetermined_shares(env)
