"""The CUDA paths: sampling, both trainers in bf16 (MAGRPO in fp16 too), an NCCL launch, agents on two devices.

Marked ``gpu`` and deselected by default; run them on a machine with a CUDA GPU with

    python -m pytest -m gpu tests/runtime/test_gpu.py

(``benchmarks/gpu_check.sh`` does that and more). Without CUDA every test skips, saying so.
``LLM_MARL_GPU_TEST_DEVICE=cpu`` runs the same bodies on the CPU instead: a dry run of this file's
code on a machine without a GPU (the cross-device comparisons then compare the CPU with itself, and the
launch joins with gloo instead of NCCL).

All models are the tiny random Llama of :func:`llm_marl.models.tiny_model` (2 layers, width 64, the
SmolLM2 tokenizer), built on the CPU and moved, as a user's model would be.
"""
from __future__ import annotations

import copy
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llm_marl.backends.hf import HFPolicy, generate_all
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.team import Team, default_lora_config
from tests.ddp_worker import build_mappo, build_trainer, mappo_trainable, trainable
from tests.toy_env import SayNumberEnv
from trainers.common.checkpoint import latest_checkpoint
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
DEVICE_ENV = "LLM_MARL_GPU_TEST_DEVICE"

# Log-probs of the same float32 model on the CPU and on CUDA differ by rounding only: the tiny model's logits
# are sums of 64 products (float32, relative error ~1e-7 each) and a log-prob subtracts a log-sum-exp over
# 49152 words (~10.8), so they agree to ~1e-6. 1e-4 leaves a 100x margin, and two tokens whose log-probs are
# that close may swap places under greedy decoding (a tie within rounding).
LOGPROB_ATOL = 1e-4

PROMPTS = [[{"role": "user", "content": f"Agent {i}: say the number {n}."}] for i, n in enumerate((3, 17, 256, 9041))] \
    + [[{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 12 + 30?"}],
       [{"role": "user", "content": "Count: one two three four five six seven eight nine ten"}]]


@pytest.fixture
def device() -> torch.device:
    """The CUDA device under test (``LLM_MARL_GPU_TEST_DEVICE`` overrides it for a dry run)."""
    forced = os.environ.get(DEVICE_ENV)
    if forced:
        return torch.device(forced)
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: torch.cuda.is_available() is False "
                    f"(set {DEVICE_ENV}=cpu to dry-run the test code on the CPU)")
    return torch.device("cuda", 0)


@pytest.fixture
def ieee_float32():
    """float32 products in full float32 (no TF32) for the cross-device comparisons; restored afterwards."""
    # torch >= 2.9 names it fp32_precision ("ieee" / "tf32") and refuses a mix with the older allow_tf32 flags
    name, ieee = ("fp32_precision", "ieee") if hasattr(torch.backends.cuda.matmul, "fp32_precision") \
        else ("allow_tf32", False)
    backends = (torch.backends.cuda.matmul, torch.backends.cudnn)
    saved = [getattr(backend, name) for backend in backends]
    for backend in backends:
        setattr(backend, name, ieee)
    yield
    for backend, value in zip(backends, saved):
        setattr(backend, name, value)


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Each trainer here builds its own ``Accelerator`` (precisions differ); accelerate's state is a per-process
    singleton, reset around every test."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def on(device: torch.device, model) -> torch.nn.Module:
    """A copy of ``model`` on ``device`` (the original stays on the CPU)."""
    return copy.deepcopy(model).to(device)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (the shorter's length if one is a prefix), else None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def next_token_logprobs(model, ids: list[int]) -> torch.Tensor:
    """``log_softmax`` of ``model``'s logits after ``ids`` (float32, on the CPU)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=next(model.parameters()).device)).logits[0, -1]
    return torch.log_softmax(logits.float().cpu(), -1)


def assert_same_greedy(reference_model, ours, theirs, what: str) -> float:
    """Greedy generations ``ours`` equal ``theirs`` token for token, or part at a tie within rounding (scored by
    ``reference_model``); their log-probs agree to :data:`LOGPROB_ATOL` up to there. Returns the largest
    log-prob difference seen."""
    largest = 0.0
    for row, (mine, other) in enumerate(zip(ours, theirs)):
        mine, other = mine[0], other[0]
        assert mine.prompt_ids == other.prompt_ids, f"{what}: row {row} encoded its prompt differently"
        split = first_divergence(mine.completion_ids, other.completion_ids)
        common = len(mine.completion_ids) if split is None else split
        if common:
            difference = (torch.tensor(mine.logprobs[:common]) - torch.tensor(other.logprobs[:common])).abs().max()
            largest = max(largest, float(difference))
            assert difference <= LOGPROB_ATOL, f"{what}: row {row} log-probs differ by {float(difference):.2e}"
        if split is not None and split < min(len(mine.completion_ids), len(other.completion_ids)):
            scores = next_token_logprobs(reference_model, mine.prompt_ids + mine.completion_ids[:split])
            a, b = mine.completion_ids[split], other.completion_ids[split]
            gap = float((scores[a] - scores[b]).abs())
            assert gap <= LOGPROB_ATOL, f"{what}: row {row} parts at token {split} ({a} vs {b}) with a log-prob " \
                                        f"gap of {gap:.2e}, more than rounding"
            print(f"{what}: row {row} parts at token {split}, a tie within {gap:.1e}")
    return largest


# ----------------------------------------------------------------------------- sampling
def test_greedy_generation_on_the_gpu_matches_the_cpu_with_the_prefix_store(device, ieee_float32):
    model, tokenizer = tiny_model(seed=0)
    cpu = HFPolicy(model, tokenizer)
    gpu = HFPolicy(on(device, model), tokenizer)
    assert gpu.device == device and gpu.reuse_cache and gpu.splice_answers and gpu.draft_tokens > 0   # the defaults
    greedy = SamplingParams(max_new_tokens=24, temperature=0)
    first_cpu, first_gpu = cpu.generate(PROMPTS, greedy), gpu.generate(PROMPTS, greedy)
    largest = assert_same_greedy(model, first_gpu, first_cpu, "turn 1, cuda vs cpu")
    # a second turn continues each answer: spliced ids, a prefill from the prefix store past the first turn
    follow_up = [conversation + [{"role": "assistant", "content": first[0].text},
                                 {"role": "user", "content": "Say it again."}]
                 for conversation, first in zip(PROMPTS, first_gpu)]
    hits = gpu.cache_stats.hits
    second_gpu = gpu.generate(follow_up, greedy)
    assert gpu.cache_stats.hits > hits, "the second turn must prefill from the prefix store"
    second_plain = HFPolicy(on(device, model), tokenizer, reuse_cache=False, splice_answers=True, draft_tokens=0,
                            drop_finished_rows=False)
    for conversation, first in zip(PROMPTS, first_gpu):             # the same spliced ids, without the store
        second_plain.splicer.remember(conversation, first[0].prompt_ids, first[0].completion_ids, first[0].text)
    largest = max(largest, assert_same_greedy(model, second_gpu, second_plain.generate(follow_up, greedy),
                                              "turn 2, cuda: prefix store vs none"))
    cpu_follow_up = [conversation + [{"role": "assistant", "content": first[0].text},
                                     {"role": "user", "content": "Say it again."}]
                     for conversation, first in zip(PROMPTS, first_cpu)]
    if [g[0].completion_ids for g in first_gpu] == [g[0].completion_ids for g in first_cpu]:
        largest = max(largest, assert_same_greedy(model, second_gpu, cpu.generate(cpu_follow_up, greedy),
                                                  "turn 2, cuda vs cpu"))
    print(f"MEASURED greedy log-prob difference cuda vs cpu / store vs none: {largest:.2e} (bound {LOGPROB_ATOL})")


def test_sampling_on_the_gpu_replays_its_seed_and_scores_like_the_cpu(device, ieee_float32):
    model, tokenizer = tiny_model(seed=0)
    gpu = HFPolicy(on(device, model), tokenizer)
    sampled = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=7)
    first = gpu.generate(PROMPTS, sampled, num_samples=3)
    gpu.clear_cache()
    again = gpu.generate(PROMPTS, sampled, num_samples=3)
    ids = [[g.completion_ids for g in group] for group in first]
    assert ids == [[g.completion_ids for g in group] for group in again], "a seeded call must replay"
    assert len({tuple(g) for group in ids for g in group}) > len(PROMPTS), "samples of a prompt must differ"
    other_seed = gpu.generate(PROMPTS, SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=8),
                              num_samples=3)
    assert [[g.completion_ids for g in group] for group in other_seed] != ids
    # the sampler's log-probs (temperature 1) are the model's: scored again on the CPU
    rows = [g for group in first for g in group]
    cpu = HFPolicy(model, tokenizer)
    logp, mask = cpu.token_logprobs([g.prompt_ids for g in rows], [g.completion_ids for g in rows])
    largest = 0.0
    for row, g in enumerate(rows):
        scored = logp[row, : len(g.completion_ids)].detach()
        difference = float((scored - torch.tensor(g.logprobs)).abs().max())
        largest = max(largest, difference)
        assert difference <= LOGPROB_ATOL, f"row {row}: sampled log-probs differ from the CPU's by {difference:.2e}"
    print(f"MEASURED sampled log-probs cuda vs cpu scoring: {largest:.2e} (bound {LOGPROB_ATOL})")


def test_generate_all_on_gpu_policies_replays_under_the_global_seed(device):
    policies = [HFPolicy(on(device, m), t) for m, t in (tiny_model(seed=0), tiny_model(seed=1))]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95)     # unseeded: seeds drawn per call
    calls = [(policy, PROMPTS[:3], {"num_samples": 2}) for policy in policies]

    def run():
        torch.manual_seed(11)
        for policy in policies:
            policy.clear_cache()
        return [[[g.completion_ids for g in group] for group in out] for out in generate_all(calls, params)]

    first = run()
    assert run() == first
    assert first[0] != first[1]                                     # different models, different samples


# ----------------------------------------------------------------------------- trainers in bf16
def assert_placed(trainer, device: torch.device) -> None:
    """Every weight of the team on ``device``; on a GPU, stored row-major (the input-major layout is the CPU's)."""
    for policy in trainer.team.policies():
        assert {p.device for p in policy.model.parameters()} == {device}
        if device.type != "cpu":
            weights = [p for n, p in policy.model.named_parameters() if "lora_" not in n and p.dim() == 2]
            assert all(p.is_contiguous() for p in weights), "weights moved to a GPU should be stored row-major"


def test_magrpo_trains_in_bf16_on_the_gpu_and_resumes(device, tmp_path):
    trainer = build_trainer(tmp_path / "run", max_steps=2, init_seed=0, mixed_precision="bf16")
    assert_placed(trainer, device)
    layer = trainer.team.policy("agent_0").model.get_base_model().model.layers[0].mlp.down_proj
    dtypes = set()
    hook = layer.register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
    before = {name: t.detach().clone() for name, t in trainable(trainer).items()}
    history = trainer.train()
    hook.remove()
    after = trainable(trainer)
    assert dtypes == {torch.bfloat16}, f"rollouts and losses should run under bf16 autocast, saw {dtypes}"
    assert [r["step"] for r in history] == [1, 2]
    losses = [v for r in history for k, v in r.items() if k.endswith("/loss") or k.endswith("/grad_norm")]
    assert losses and all(math.isfinite(v) for v in losses)
    assert all(t.dtype == torch.float32 and t.device == device for t in after.values())   # weights stay float32
    moved = [n for n, t in after.items() if not torch.equal(t, before[n])]
    assert {n.split("/")[0] for n in moved} == {"agent_0", "agent_1"}, "every agent's LoRA weights should move"
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert checkpoint is not None and checkpoint.name == "step-000002"

    torch.manual_seed(123)                                         # other LoRA init: the checkpoint must replace it
    resumed = build_trainer(tmp_path / "run", max_steps=3, resume=True, init_seed=5, mixed_precision="bf16")
    resumed.load(checkpoint)
    for name, tensor in trainable(resumed).items():
        assert torch.equal(tensor, after[name]), f"{name} not restored from the checkpoint"
    continued = resumed.train()                                    # resume_from_checkpoint="latest": step 3 only
    assert [r["step"] for r in continued] == [3] and resumed.step == 3
    assert latest_checkpoint(tmp_path / "run").name == "step-000003"
    assert any(not torch.equal(t, after[n]) for n, t in trainable(resumed).items())


def test_magrpo_trains_in_fp16_with_loss_scaling_on_the_gpu(device, tmp_path):
    if device.type != "cuda":
        pytest.skip("fp16 autocast and loss scaling need CUDA (refused on the CPU)")
    trainer = build_trainer(tmp_path / "fp16", max_steps=2, init_seed=0, mixed_precision="fp16")
    assert trainer.accelerator.scaler is not None
    before = {name: t.detach().clone() for name, t in trainable(trainer).items()}
    history = trainer.train()
    after = trainable(trainer)
    scale = trainer.accelerator.scaler.get_scale()
    print(f"MEASURED fp16 loss scale after 2 steps (8 optimizer steps): {scale}")
    assert math.isfinite(scale) and scale > 0
    assert all(math.isfinite(v) for r in history for k, v in r.items() if k.endswith("/loss"))
    assert all(torch.isfinite(t).all() and t.dtype == torch.float32 for t in after.values())
    moved = {n.split("/")[0] for n, t in after.items() if not torch.equal(t, before[n])}
    assert moved == {"agent_0", "agent_1"}, "every update was skipped for overflow: the weights did not move"


def test_mappo_trains_policy_and_critic_in_bf16_on_the_gpu(device, tmp_path):
    # the say-a-number env: the arithmetic debate's problems come from reasoning-gym, which needs a C extension
    trainer = build_mappo(tmp_path / "mappo", max_steps=1, init_seed=0, env=SayNumberEnv(num_turns=2),
                          mixed_precision="bf16")
    assert_placed(trainer, device)
    assert {p.device for p in trainer.critic.head.parameters()} == {device}
    before = {name: t.detach().clone() for name, t in mappo_trainable(trainer).items()}
    history = trainer.train()
    after = mappo_trainable(trainer)
    assert [r["step"] for r in history] == [1]
    assert all(math.isfinite(v) for v in history[0].values() if isinstance(v, float))
    moved = {n.split("/")[0] for n, t in after.items() if not torch.equal(t.cpu(), before[n].cpu())}
    assert moved == {"agent_0", "agent_1", "critic"}, f"policy and critic weights should all move, moved: {moved}"
    assert any(not torch.equal(t.cpu(), before[n].cpu()) for n, t in after.items() if "head" in n), \
        "the critic's value head should move"
    assert latest_checkpoint(tmp_path / "mappo") is not None


# ----------------------------------------------------------------------------- launched
def test_a_launched_process_joins_with_nccl_and_trains_with_and_without_fsdp(device, tmp_path):
    # One GPU: NCCL refuses two ranks on one device, so the launch holds ONE process (world size 1). That
    # checks the process group, the device each process takes and the trainers' collectives on it; with one
    # process fsdp=True trains unsharded (nothing to shard over), so FSDP2 sharding itself needs 2 GPUs.
    # torchrun itself: `accelerate launch` refuses --multi_gpu for one process and runs one without a process group
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(port),
               str(ROOT / "tests" / "gpu_worker.py"), str(tmp_path), "plain", "fsdp"]
    # the caller's PYTHONPATH kept: on the GPU machine it holds the carried wheels
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    if device.type == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    expected_device = "cuda:0" if device.type == "cuda" else "cpu"
    for job in ("plain", "fsdp"):
        report = json.loads((tmp_path / job / "report.json").read_text())
        print(f"MEASURED launch {job}: {report}")
        assert report["backend"] == ("nccl" if device.type == "cuda" else "gloo")
        assert report["world_size"] == 1
        assert report["accelerator_device"] in ({"cuda:0"} if device.type == "cuda" else {"cpu", "cpu:0"})
        assert report["parameter_devices"] == [expected_device]
        assert report["trainable_dtypes"] == ["torch.float32"] and not report["sharded"]
        assert report["steps"] == [1, 2] and report["losses_finite"]
        assert report["moved"] == ["agent_0", "agent_1"]
        assert report["checkpoints"] == ["step-000001", "step-000002"]


# ----------------------------------------------------------------------------- agents on two devices
@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_agents_on_the_gpu_and_the_cpu_train_together(device, tmp_path, precision):
    agents = ["agent_0", "agent_1"]
    torch.manual_seed(0)
    team = Team.separate([tiny_model(seed=0), tiny_model(seed=1)], agents, lora_config=default_lora_config())
    config = MAGRPOConfig(num_generations=3, max_new_tokens=6, max_steps=1, prompts_per_step=2, eval_tasks=2,
                          learning_rate=5e-3, kl_coef=0.05, output_dir=str(tmp_path), report_to=("jsonl",),
                          progress=False, mixed_precision=precision,
                          agent_devices={"agent_0": str(device), "agent_1": "cpu"})
    trainer = MAGRPOTrainer(SayNumberEnv(num_turns=2), team, config)
    assert trainer.team.policy("agent_0").device.type == device.type
    assert trainer.team.policy("agent_1").device == torch.device("cpu")
    before = {name: t.detach().clone() for name, t in trainable(trainer).items()}
    history = trainer.train()
    after = trainable(trainer)
    assert all(math.isfinite(v) for k, v in history[0].items() if k.endswith("/loss"))
    moved = {n.split("/")[0] for n, t in after.items() if not torch.equal(t.cpu(), before[n].cpu())}
    assert moved == set(agents)
    assert {after[n].device.type for n in after if n.startswith("agent_0/")} == {device.type}
    assert {after[n].device.type for n in after if n.startswith("agent_1/")} == {"cpu"}
    evaluation = trainer.evaluate()
    assert len(evaluation.rewards) == 2
    assert latest_checkpoint(tmp_path).name == "step-000001"
