"""Registry errors list the valid choices; data loading says where it looked."""
import json
import re
import warnings

import pytest

import llm_marl_envs
from llm_marl_envs.data import DataNotFoundError, DatasetSpec, hash_split, load_records
from llm_marl_envs.registry import newest_version
from llm_marl_envs.testing import held_out_test


def test_unknown_env_id_lists_registered_ids():
    with pytest.raises(ValueError, match="gsm8k_debate-v0"):
        llm_marl_envs.make("gsm8k-debate")


def test_unknown_keyword_lists_accepted_names():
    with pytest.raises(TypeError, match=r"num_turn.*accepted: .*num_turns"):
        llm_marl_envs.make("gsm8k_debate-v0", num_turn=2)


@pytest.mark.parametrize("name, value", [("num_agents", "2"), ("num_agents", 2.0), ("num_agents", True),
                                         ("num_turns", "3"), ("num_turns", 1.5)])
def test_a_count_of_the_wrong_type_is_a_type_error(name, value):
    with pytest.raises(TypeError, match=rf"{name} must be an int, got {value!r} \({type(value).__name__}\)"):
        llm_marl_envs.make("gsm8k_debate-v0", **{name: value})
    with pytest.raises(ValueError, match=r"num_agents >= 1, got num_agents=0"):
        llm_marl_envs.make("gsm8k_debate-v0", num_agents=0)          # a value out of range stays a value error


CURRENT_ENVS = [env_id for env_id in llm_marl_envs.list_envs() if newest_version(env_id) == env_id]
DEBATE_ENVS = [env_id for env_id in llm_marl_envs.list_envs() if re.search(r"_debate-v\d+$", env_id)]
FAMILY_OPTIONS = {"_debate": {"show_scores": True, "stop_on_consensus": True},
                  "_writing": {"semantic_judge": False}, "_coding": {"test_timeout_s": 5.0}}
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
        if env_id.rsplit("-v", 1)[0].endswith(suffix):
            assert set(options) <= accepted
            llm_marl_envs.make(env_id, **options)
    with pytest.raises(TypeError, match=r"\['no_such_option'\]; accepted: \[.*'num_agents'.*'render_mode'"):
        llm_marl_envs.make(env_id, no_such_option=1)


@pytest.mark.parametrize("env_id", llm_marl_envs.list_envs())
def test_the_registered_table_row_is_what_the_env_says(env_id):
    env_spec = llm_marl_envs.spec(env_id)
    assert env_spec.summary is not None, f"register {env_id} with summary=EnvSummary(...) for `llm-marl envs`"
    env_cls = env_spec.load()
    assert env_spec.summary == llm_marl_envs.EnvSummary(env_spec.default("num_agents"), env_spec.default("num_turns"),
                                                        env_cls.data_source, env_cls.verifier_name)


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


# ----------------------------------------------------------------------------- held-out splits
@pytest.fixture
def hub_unreachable(monkeypatch):
    """The quick check passes but every hub call then fails at once (the load's own error is reported)."""
    from llm_marl_envs import data

    def unreachable(spec, split):
        raise ConnectionError(f"no network in this test (hub {spec.hub_id!r}, split {split!r})")

    monkeypatch.setattr(data, "hub_unreachable", lambda: None)
    monkeypatch.setattr(data, "_load_hub", unreachable)


@pytest.mark.parametrize("env_id", CURRENT_ENVS)
def test_every_env_has_disjoint_train_and_test_splits_offline(env_id, data_dir, hub_unreachable):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="anli_r3 split 'train': no local file or hub copy")
        train = llm_marl_envs.make(env_id, split="train", data_dir=data_dir)
        test = llm_marl_envs.make(env_id, split="test", data_dir=data_dir)
        held_out_test(train, test)


def test_held_out_test_compares_content_not_ids(data_dir):
    from llm_marl_envs.testing import task_text

    env = llm_marl_envs.make("gsm8k_debate-v0", data_dir=data_dir)
    twin = llm_marl_envs.make("gsm8k_debate-v0", split="train", data_dir=data_dir)
    task = dict(env.tasks[3], task_id="renamed", question="  " + env.tasks[3]["question"].upper() + "\n")
    twin._tasks = [*twin.tasks[:5], task]                  # the same question under another id and spacing
    assert task_text(twin, task) == task_text(env, env.tasks[3])
    with pytest.raises(AssertionError, match=r"1 of 1319 tasks of split 'test' are also in split 'train'"):
        held_out_test(twin, env)


def test_anli_trains_on_the_dev_file_when_nothing_else_has_train(tmp_path, data_dir, hub_unreachable):
    from llm_marl_envs.envs.anli_debate import ANLI_R3

    with pytest.warns(UserWarning, match=r"anli_r3 split 'train': no local file or hub copy, using the stand-in "
                                         r".*anli_r3/dev.jsonl"):
        train = load_records(ANLI_R3, "train", data_dir)
    assert train == load_records(ANLI_R3, "dev", data_dir) and len(train) == 1200
    (tmp_path / "anli_r3").mkdir()                         # a local train file, where one exists, comes first
    row = {"uid": "t1", "context": "A cat sat.", "hypothesis": "An animal sat.", "label": "e"}
    (tmp_path / "anli_r3" / "train.jsonl").write_text(json.dumps(row) + "\n")
    assert [r["task_id"] for r in load_records(ANLI_R3, "train", tmp_path)] == ["anli_r3/t1"]


def test_missing_stand_in_is_named_in_the_error(tmp_path, monkeypatch, hub_unreachable):
    from llm_marl_envs.envs.anli_debate import ANLI_R3

    monkeypatch.delenv("LLM_MARL_DATA_DIR", raising=False)
    with pytest.raises(DataNotFoundError) as err:
        load_records(ANLI_R3, "train", tmp_path)
    assert f"{tmp_path / 'anli_r3' / 'dev.jsonl'} (data_dir argument, stand-in for split 'train')" in str(err.value)
    assert "ConnectionError" in str(err.value)


def test_hash_split_is_a_fixed_function_of_the_canonical_text():
    assert hash_split("What is 2 + 2?") == hash_split("  what is 2 +   2?\n")
    assert {hash_split(f"problem {i}") for i in range(20)} == {"train", "test"}
    share = sum(hash_split(f"problem {i}", train_fraction=0.8) == "train" for i in range(2000)) / 2000
    assert 0.77 < share < 0.83
    with pytest.raises(ValueError, match=r"train_fraction must be in \(0, 1\), got 1"):
        hash_split("x", train_fraction=1)


# ----------------------------------------------------------------------------- versions
def test_anli_v0_warns_and_names_v1_while_v1_is_current():
    with pytest.warns(DeprecationWarning, match=r"anli_debate-v0 is out of date: use anli_debate-v1"):
        old = llm_marl_envs.make("anli_debate-v0")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*out of date", category=DeprecationWarning)
        new = llm_marl_envs.make("anli_debate-v1")
    assert (old.metadata["name"], new.metadata["name"]) == ("anli_debate-v0", "anli_debate-v1")
    assert newest_version("anli_debate-v0") == newest_version("anli_debate-v1") == "anli_debate-v1"
    assert newest_version("gsm8k_debate-v0") == "gsm8k_debate-v0"


def test_anli_v0_keeps_its_data_and_v1_has_the_current_data(data_dir, hub_unreachable):
    with pytest.warns(DeprecationWarning):
        old_test = llm_marl_envs.make("anli_debate-v0", data_dir=data_dir)
        old_train = llm_marl_envs.make("anli_debate-v0", split="train", data_dir=data_dir)
    assert old_test.tasks == llm_marl_envs.make("anli_debate-v1", data_dir=data_dir).tasks
    with pytest.raises(DataNotFoundError, match=r"no local file for split 'train'"):
        old_train.tasks                                   # v0: train from the hub only
    new_train = llm_marl_envs.make("anli_debate-v1", split="train", data_dir=data_dir)
    with pytest.warns(UserWarning, match="using the stand-in"):
        assert len(new_train.tasks) == 1200               # v1: the dev file stands in offline
