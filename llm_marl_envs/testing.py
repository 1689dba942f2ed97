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
"""
from __future__ import annotations

import warnings
from collections.abc import Callable

from pettingzoo.test import parallel_api_test, parallel_seed_test

from .core import TextEnv, render_messages
from .data import Record, canonical_text

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
    """What makes two tasks the same: the canonical text of agent 0's opening messages for ``task``."""
    return canonical_text("\n".join(m["content"] for m in env.first_prompt(0, task)))


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
