"""text_env_api_test runs PettingZoo's checks without the env warning about PettingZoo's own probe option."""
from __future__ import annotations

import warnings

import pytest

from llm_marl_envs.testing import text_env_api_test
from tests.toy_env import SayNumberEnv


def test_compliance_checks_do_not_warn_about_pettingzoos_probe_option():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text_env_api_test(lambda: SayNumberEnv(num_agents=2, num_turns=2), num_cycles=3)
    assert not [w for w in caught if "unknown reset option" in str(w.message)]


def test_a_users_unknown_reset_option_still_warns():
    with pytest.warns(UserWarning, match=r"ignoring unknown reset option\(s\) \['options'\]"):
        SayNumberEnv().reset(seed=0, options={"options": 1})


def test_env_warnings_are_plain_text_without_terminal_colour_codes():
    with pytest.warns(UserWarning) as caught:
        SayNumberEnv().reset(seed=0, options={"options": 1})
        SayNumberEnv().render()
    messages = [str(w.message) for w in caught]
    assert messages[0].startswith("ignoring unknown reset option(s) ['options']")
    assert messages[1].startswith("render() called without render_mode")
    assert not [m for m in messages if "\x1b[" in m], messages
