"""The debate examples' ``--seeds``: one run per seed, resumable, and the spread of the held-out gain."""
import json
import sys

import numpy as np
import pytest
import torch

from tests.scripts import load_script
from trainers.common.experiment import seed_spread

TINY_RUN = ["--steps", "1", "--eval-tasks", "3", "--samples", "0", "--max-new-tokens", "8", "--threads", "1"]
EXAMPLE_ARGS = {"examples/magrpo_debate.py": ["--prompts-per-step", "1", "--num-generations", "2"],
                "examples/mappo_debate.py": ["--episodes-per-step", "2"]}


def _adapters(results):
    """Every agent's adapter tensors in a run's final checkpoint."""
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted((Path(results["checkpoint"]) / "agents").glob("*/adapter_model.safetensors"))
    assert files, f"no adapter in {results['checkpoint']}"
    return {f"{f.parent.name}/{k}": t for f in files for k, t in load_file(f).items()}


def _untimed(history):
    """A training history without its wall-clock entries."""
    return [{k: v for k, v in row.items() if not (k.startswith("time") or k.endswith("_s"))} for row in history]


def _main(script, monkeypatch, argv):
    module = load_script(script)
    monkeypatch.setattr(sys, "argv", [script, *argv])
    module.main()
    return module


@pytest.mark.parametrize("script", sorted(EXAMPLE_ARGS))
def test_seed_repeats_run_each_seed_as_alone_and_report_each_gain(script, tmp_path, tiny_model_dir, monkeypatch):
    common = ["--model", str(tiny_model_dir), *TINY_RUN, *EXAMPLE_ARGS[script]]
    module = _main(script, monkeypatch, [*common, "--seeds", "0,1", "--out", str(tmp_path / "repeat")])
    summary = json.loads((tmp_path / "repeat" / "seeds.json").read_text())
    runs = {s: json.loads((tmp_path / "repeat" / f"seed-{s}" / "results.json").read_text()) for s in (0, 1)}
    assert (tmp_path / "repeat" / "seeds.png").stat().st_size > 0
    assert summary["seeds"] == [0, 1] and list(summary["settings"]) == ["greedy"]
    gains = [runs[s]["greedy"]["final_turn_accuracy"]["paired_difference"]["mean"] for s in (0, 1)]
    spread = summary["settings"]["greedy"]["gain"]
    assert [spread["per_seed"][str(s)]["mean"] for s in (0, 1)] == gains
    assert spread["mean"] == pytest.approx(np.mean(gains)) and spread["std"] == pytest.approx(np.std(gains, ddof=1))
    assert runs[0]["config"]["seed"] == 0 and runs[1]["config"]["seed"] == 1
    adapters = {s: _adapters(runs[s]) for s in (0, 1)}
    assert any(not torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0]), "the seeds trained the same way"

    # seed 1 inside the repeat trained exactly as seed 1 alone (the run before it leaves nothing behind)
    _main(script, monkeypatch, [*common, "--seed", "1", "--out", str(tmp_path / "alone")])
    alone = json.loads((tmp_path / "alone" / "results.json").read_text())
    assert _untimed(alone["train_history"]) == _untimed(runs[1]["train_history"])
    assert all(torch.equal(t, adapters[1][k]) for k, t in _adapters(alone).items())

    # run again: every seed is reused (nothing trains), and the summary is the same
    def refuse(config, args):
        raise AssertionError(f"seed {config.seed} ran again")

    monkeypatch.setattr(module, "run", refuse)
    monkeypatch.setattr(sys, "argv", [script, *common, "--seeds", "0,1", "--out", str(tmp_path / "repeat")])
    module.main()
    assert json.loads((tmp_path / "repeat" / "seeds.json").read_text())["settings"] == summary["settings"]


def test_seed_repeats_refuse_one_seed_and_a_resume(tmp_path):
    from argparse import Namespace

    from trainers.common.experiment import repeat_over_seeds
    from trainers.magrpo import MAGRPOConfig

    config = MAGRPOConfig(output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="at least two distinct seeds"):
        repeat_over_seeds(lambda c, a: {}, config, Namespace(resume=None), [3, 3], title="t")
    with pytest.raises(ValueError, match="cannot be combined with --seeds"):
        repeat_over_seeds(lambda c, a: {}, config, Namespace(resume="x"), [0, 1], title="t")


def test_seed_spread_is_the_mean_and_sample_std_of_the_seeds_means():
    values = [{"mean": 0.1, "low": 0.0, "high": 0.2}, {"mean": 0.3, "low": 0.2, "high": 0.4},
              {"mean": -0.1, "low": -0.2, "high": 0.0}]
    spread = seed_spread([0, 1, 2], values)
    assert spread["mean"] == pytest.approx(0.1) and spread["std"] == pytest.approx(0.2)
    assert (spread["min"], spread["max"]) == (-0.1, 0.3) and spread["per_seed"]["1"] == values[1]


def test_one_groups_seeds_stay_in_its_slot_not_across_the_axis():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainers.common.experiment import plot_seed_points

    per_seed = {str(s): {"mean": 0.1 * s, "low": 0.1 * s - 0.02, "high": 0.1 * s + 0.02} for s in range(3)}
    fig, ax = plt.subplots()
    plot_seed_points(ax, 0, per_seed, [0, 1, 2], width=0.15, label=True)
    left, right = ax.get_xlim()
    assert left <= -0.5 and right >= 0.5          # the seeds sit within ±0.15 of the one tick, not at the edges
    plot_seed_points(ax, 1, per_seed, [0, 1, 2], width=0.15, label=False)
    assert ax.get_xlim()[0] == left and ax.get_xlim()[1] >= 1.5
    plt.close(fig)
