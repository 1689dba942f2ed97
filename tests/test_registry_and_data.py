"""Registry errors list the valid choices; data loading says where it looked."""
import json

import pytest

import llm_marl_envs
from llm_marl_envs.data import DataNotFoundError, DatasetSpec, load_records


def test_unknown_env_id_lists_registered_ids():
    with pytest.raises(ValueError, match="gsm8k_debate-v0"):
        llm_marl_envs.make("gsm8k-debate")


def test_unknown_keyword_lists_accepted_names():
    with pytest.raises(TypeError, match=r"num_turn.*accepted: .*num_turns"):
        llm_marl_envs.make("gsm8k_debate-v0", num_turn=2)


DEBATE_ENVS = [env_id for env_id in llm_marl_envs.list_envs() if env_id.endswith("_debate-v0")]
FAMILY_OPTIONS = {"_debate-v0": {"show_scores": True, "stop_on_consensus": True},
                  "_writing-v0": {"semantic_judge": False}, "_coding-v0": {"test_timeout_s": 5.0}}
COMMON_OPTIONS = {"num_agents", "num_turns", "split", "data_dir", "max_action_chars", "render_mode"}


@pytest.mark.parametrize("env_id", DEBATE_ENVS)
def test_every_debate_env_takes_every_debate_option(env_id):
    env = llm_marl_envs.make(env_id, show_scores=True, stop_on_consensus=True, num_agents=2, num_turns=2)
    assert env.show_scores is True and env.stop_on_consensus is True and env.num_turns == 2


@pytest.mark.parametrize("env_id", llm_marl_envs.list_envs())
def test_accepted_arguments_include_the_base_classes(env_id):
    accepted = set(llm_marl_envs.spec(env_id).parameters())
    assert COMMON_OPTIONS <= accepted
    for suffix, options in FAMILY_OPTIONS.items():
        if env_id.endswith(suffix):
            assert set(options) <= accepted
            llm_marl_envs.make(env_id, **options)
    with pytest.raises(TypeError, match=r"\['no_such_option'\]; accepted: \[.*'num_agents'.*'render_mode'"):
        llm_marl_envs.make(env_id, no_such_option=1)


def test_defaults_come_from_the_most_derived_class():
    assert llm_marl_envs.spec("arithmetic_debate-v0").default("num_turns") == 3   # DebateEnv, not TextEnv's 1
    assert llm_marl_envs.spec("arithmetic_debate-v0").default("num_tasks") == 500
    assert llm_marl_envs.spec("mbpp_coding-v0").default("num_turns") == 2
    assert llm_marl_envs.spec("tldr_writing-v0").default("num_turns") == 1


def test_a_factory_with_open_kwargs_takes_any_keyword():
    from llm_marl_envs.envs.gsm8k_debate import GSM8KDebateEnv

    llm_marl_envs.register("test_factory-v0", lambda **kwargs: GSM8KDebateEnv(**kwargs))
    try:
        assert llm_marl_envs.make("test_factory-v0", show_scores=True).show_scores is True
    finally:
        from llm_marl_envs import registry
        registry._REGISTRY.pop("test_factory-v0")


def test_register_defaults_and_duplicates():
    llm_marl_envs.register("test_short_gsm8k-v0", "llm_marl_envs.envs.gsm8k_debate:GSM8KDebateEnv", num_turns=1)
    try:
        env = llm_marl_envs.make("test_short_gsm8k-v0")
        assert env.num_turns == 1
        assert llm_marl_envs.make("test_short_gsm8k-v0", num_turns=4).num_turns == 4
        with pytest.raises(ValueError, match="already registered"):
            llm_marl_envs.register("test_short_gsm8k-v0", "x:y")
    finally:
        from llm_marl_envs import registry
        registry._REGISTRY.pop("test_short_gsm8k-v0")
    with pytest.raises(ValueError, match="module:ClassName"):
        llm_marl_envs.register("bad-v0", "no_colon_here")


def test_local_data_matches_published_sizes(data_dir):
    from llm_marl_envs.envs.anli_debate import ANLI_R3
    from llm_marl_envs.envs.gsm8k_debate import GSM8K

    assert len(load_records(GSM8K, "train", data_dir)) == 7473
    assert len(load_records(GSM8K, "test", data_dir)) == 1319
    assert len(load_records(ANLI_R3, "test", data_dir)) == 1200


def test_missing_data_error_names_every_place_looked(tmp_path, monkeypatch):
    from llm_marl_envs.envs.gsm8k_debate import GSM8K

    monkeypatch.setenv("LLM_MARL_DATA_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataNotFoundError) as err:
        load_records(GSM8K, "test", tmp_path / "arg")
    msg = str(err.value)
    assert str(tmp_path / "arg" / "gsm8k" / "test.jsonl") in msg
    assert str(tmp_path / "nowhere" / "gsm8k" / "test.jsonl") in msg
    assert "openai/gsm8k" in msg and "LLM_MARL_DATA_DIR" in msg


def test_unknown_split_is_a_value_error():
    from llm_marl_envs.envs.gsm8k_debate import GSM8K

    with pytest.raises(ValueError, match=r"no split 'validation'.*\['test', 'train'\]"):
        load_records(GSM8K, "validation")


def test_hub_path_is_real_datasets_code(tmp_path):
    """The hub branch is datasets.load_dataset; a local dataset folder exercises it offline."""
    rows = [{"q": "1+1", "a": "2"}, {"q": "2+2", "a": "4"}]
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    spec = DatasetSpec(name="toy", local_dir="toy", local_files={}, hub_id=str(tmp_path),
                       hub_splits={"test": "test"},
                       normalize=lambda r, i: {"task_id": f"toy/{i}", "question": r["q"], "answer": r["a"]})
    records = load_records(spec, "test")
    assert records == [{"task_id": "toy/0", "question": "1+1", "answer": "2"},
                       {"task_id": "toy/1", "question": "2+2", "answer": "4"}]


def test_malformed_jsonl_names_file_and_line(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{oops\n')
    from llm_marl_envs.envs.gsm8k_debate import GSM8K

    with pytest.raises(ValueError, match=r"test.jsonl:2: not valid JSON"):
        load_records(GSM8K, "test", tmp_path)
