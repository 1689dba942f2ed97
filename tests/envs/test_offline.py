"""Offline is fast: the hub is asked only when it is reachable, and a name found nowhere fails at once.

No test here needs or touches the network: the connection check is pointed at local sockets, or
replaced by a fixed answer, and every hub call is replaced by one that counts and fails.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from llm_marl import model_sources
from llm_marl_envs import data, hub
from llm_marl_envs.data import DataNotFoundError, load_records

ROOT = Path(__file__).resolve().parents[2]
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


@pytest.fixture
def online_variables(monkeypatch):
    """No offline variable set: the loaders decide by the connection check."""
    for name in OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def hub_calls(monkeypatch):
    """Every ``datasets.load_dataset`` call is counted and fails at once."""
    calls = []

    def load_hub(spec, split):
        calls.append((spec.hub_id, split))
        raise ConnectionError("the hub was called")

    monkeypatch.setattr(data, "_load_hub", load_hub)
    return calls


# ----------------------------------------------------------------------------- the check
def test_offline_variable_reads_true_values_only(monkeypatch):
    for name in OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert hub.offline_variable(hub.DATASETS_OFFLINE_VARIABLES) is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert hub.offline_variable(hub.DATASETS_OFFLINE_VARIABLES) is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "TRUE")
    assert hub.offline_variable(hub.DATASETS_OFFLINE_VARIABLES) == "HF_HUB_OFFLINE=TRUE"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")          # the datasets variable is read first
    assert hub.offline_variable(hub.DATASETS_OFFLINE_VARIABLES) == "HF_DATASETS_OFFLINE=1"
    assert hub.offline_variable(hub.MODELS_OFFLINE_VARIABLES) == "HF_HUB_OFFLINE=TRUE"


def test_the_check_connects_to_the_endpoint_or_its_proxy(monkeypatch):
    for name in ("HF_ENDPOINT", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert hub.hub_address() == ("huggingface.co", 443)
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example:8080")
    assert hub.hub_address() == ("mirror.example", 8080)
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.example")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert hub.hub_address() == ("proxy.example", 3128)
    monkeypatch.setenv("NO_PROXY", "localhost,hf-mirror.example")
    assert hub.hub_address() == ("hf-mirror.example", 443)


def test_the_check_reports_a_refused_connection_and_passes_a_listening_one():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert hub._connection_problem("127.0.0.1", port, 2.0) is None
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free_port = closed.getsockname()[1]
    problem = hub._connection_problem("127.0.0.1", free_port, 2.0)
    assert problem is not None and problem.startswith(f"127.0.0.1:{free_port}: ")


def test_the_check_is_made_once_per_process(monkeypatch, online_variables):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free_port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port}")
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    hub._connection_problem.cache_clear()
    first = hub.hub_unreachable()
    assert first is not None and hub.hub_unreachable() == first
    assert hub._connection_problem.cache_info().hits == 1


# ----------------------------------------------------------------------------- data
def test_local_data_is_read_without_asking_the_hub(data_dir, hub_calls, monkeypatch):
    from llm_marl_envs.envs.gsm8k_debate import GSM8K

    monkeypatch.setattr(data, "hub_unreachable", lambda: pytest.fail("the hub was checked"))
    assert len(load_records(GSM8K, "test", data_dir)) == 1319
    assert hub_calls == []


def test_an_unreachable_hub_is_not_called_before_the_stand_in(data_dir, hub_calls, monkeypatch, online_variables):
    from llm_marl_envs.envs.anli_debate import ANLI_R3

    monkeypatch.setattr(data, "hub_unreachable", lambda: "huggingface.co:443: no network in this test")
    with pytest.warns(UserWarning, match="using the stand-in"):
        train = load_records(ANLI_R3, "train", data_dir)
    assert train == load_records(ANLI_R3, "dev", data_dir)
    assert hub_calls == []


def test_an_unreachable_hub_is_named_in_the_missing_data_error(tmp_path, hub_calls, monkeypatch, online_variables):
    from llm_marl_envs.envs.gsm8k_debate import GSM8K

    monkeypatch.delenv("LLM_MARL_DATA_DIR", raising=False)
    monkeypatch.setattr(data, "hub_unreachable", lambda: "huggingface.co:443: no network in this test")
    with pytest.raises(DataNotFoundError) as err:
        load_records(GSM8K, "test", tmp_path)
    message = str(err.value)
    assert str(tmp_path / "gsm8k" / "test.jsonl") in message
    assert "'openai/gsm8k'" in message and "not called, the hub is not reachable" in message
    assert "no network in this test" in message and "HF_HUB_OFFLINE=1" in message
    assert hub_calls == []


def test_an_offline_variable_reads_the_datasets_cache_without_a_check(tmp_path, hub_calls, monkeypatch):
    from llm_marl_envs.envs.gsm8k_debate import GSM8K

    monkeypatch.delenv("LLM_MARL_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(data, "hub_unreachable", lambda: pytest.fail("checked although offline is set"))
    with pytest.raises(DataNotFoundError, match=r"\(HF_DATASETS_OFFLINE=1: the datasets cache only\) failed"):
        load_records(GSM8K, "test", tmp_path)
    assert hub_calls == [("openai/gsm8k", "test")]


def test_a_local_dataset_folder_as_hub_id_needs_no_check(tmp_path, monkeypatch, online_variables):
    (tmp_path / "test.jsonl").write_text(json.dumps({"q": "1+1", "a": "2"}) + "\n")
    spec = data.DatasetSpec(name="toy", local_dir="toy", local_files={}, hub_id=str(tmp_path),
                            hub_splits={"test": "test"},
                            normalize=lambda r, i: {"task_id": f"toy/{i}", "question": r["q"], "answer": r["a"]})
    monkeypatch.setattr(data, "hub_unreachable", lambda: pytest.fail("the hub was checked for a local folder"))
    assert load_records(spec, "test") == [{"task_id": "toy/0", "question": "1+1", "answer": "2"}]


# ----------------------------------------------------------------------------- models
@pytest.fixture
def no_from_pretrained(monkeypatch):
    """transformers' loaders fail the test if called."""
    import transformers

    def called(*args, **kwargs):
        raise AssertionError(f"from_pretrained was called with {args} {kwargs}")

    for loader in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(loader, "from_pretrained", called)


def test_a_mistyped_model_offline_fails_at_once_naming_every_place_looked(
        tmp_path, monkeypatch, online_variables, no_from_pretrained):
    from huggingface_hub import constants

    from llm_marl import models

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(model_sources, "hub_unreachable", lambda: "huggingface.co:443: no network in this test")
    with pytest.raises(ValueError) as err:
        models.load("smolm2-135m")
    message = str(err.value)
    assert message.startswith("could not load model 'smolm2-135m'. Looked for:")
    assert "an embedded model: ['smollm2-135m'] (did you mean 'smollm2-135m'?)" in message
    assert f"a local directory with config.json: {tmp_path / 'smolm2-135m'} does not exist" in message
    assert f"the Hugging Face cache: {tmp_path / 'hf-cache'} has no copy of 'smolm2-135m'" in message
    assert "the Hugging Face hub: not asked, it is not reachable (huggingface.co:443: no network" in message


def test_an_offline_variable_names_itself_and_skips_the_check(monkeypatch, online_variables, no_from_pretrained):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(model_sources, "hub_unreachable", lambda: pytest.fail("checked although offline is set"))
    with pytest.raises(ValueError, match=r"the Hugging Face hub: not asked \(HF_HUB_OFFLINE=1 is set\)"):
        model_sources.check_model_source("no-such-org/no-such-model")


def test_a_cached_hub_id_loads_from_the_cache_only_when_the_hub_is_away(tmp_path, monkeypatch, online_variables):
    from huggingface_hub import constants

    snapshot = tmp_path / "models--some-org--some-model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--some-org--some-model" / "refs").mkdir()
    (tmp_path / "models--some-org--some-model" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(model_sources, "hub_unreachable", lambda: "huggingface.co:443: no network in this test")
    options, why = model_sources.hub_options("some-org/some-model")
    assert options == {"local_files_only": True} and "not reachable" in why
    monkeypatch.setattr(model_sources, "hub_unreachable", lambda: None)
    assert model_sources.hub_options("some-org/other-model") == ({}, None)     # reachable: the hub decides
    assert model_sources.hub_options(str(tmp_path)) == ({}, None)              # a local directory


def test_the_cli_rejects_a_mistyped_model_offline_before_loading_torch():
    program = ("import sys\n"
               "from llm_marl.cli import main\n"
               "code = main(['bench', 'gsm8k_debate-v0', '--model', 'smolm2-135m', '--episodes', '1'])\n"
               "print(code, 'torch' in sys.modules, 'transformers' in sys.modules)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HOME": str(Path.home())}
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["2", "False", "False"], done.stderr
    assert "could not load model 'smolm2-135m'" in done.stderr and "did you mean 'smollm2-135m'" in done.stderr
    assert "HF_HUB_OFFLINE=1 is set" in done.stderr

