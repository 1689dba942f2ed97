"""`nucleus_sample` keeps exactly transformers' top-p set and samples within it in proportion to the probabilities."""
import pytest
import torch
from transformers.generation.logits_process import TopPLogitsWarper

from llm_marl.backends.hf import nucleus_sample


def _kept_by_transformers(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    return torch.isfinite(TopPLogitsWarper(top_p)(None, logits.clone()))


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_samples_only_transformers_nucleus(top_p):
    gen = torch.Generator().manual_seed(0)
    # peaked rows (nucleus inside the candidates) and flat rows (nucleus wider than the 64 candidates)
    logits = torch.cat([torch.randn(6, 5000, generator=gen) * 6, torch.randn(6, 5000, generator=gen) * 0.2])
    kept = _kept_by_transformers(logits, top_p)
    assert (kept.sum(-1)[6:] > 64).all()                       # the flat rows force the widening path
    drawn = []
    for _ in range(30):
        ids = nucleus_sample(logits, top_p, gen)
        assert kept.gather(-1, ids[:, None]).all()
        drawn.append(ids)
    flat_draws = torch.stack(drawn)[:, 6:]
    assert len(torch.unique(flat_draws)) > 64                  # flat rows sample beyond the first candidates


def test_frequencies_follow_the_renormalised_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(1)
    draws = nucleus_sample(logits.expand(40_000, 4), 0.7, gen, candidates=2)
    counts = torch.bincount(draws, minlength=4).float() / len(draws)
    # above-mass 0, 0.5, 0.8: the first two stay (the third's above-mass 0.8 >= 0.7)
    assert counts[2:].sum() == 0
    assert counts[0] == pytest.approx(0.5 / 0.8, abs=0.01) and counts[1] == pytest.approx(0.3 / 0.8, abs=0.01)


def test_seeded_draws_repeat_and_top_p_one_samples_the_whole_vocabulary():
    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(2))
    a = nucleus_sample(logits, 0.9, torch.Generator().manual_seed(5))
    b = nucleus_sample(logits, 0.9, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    wide = torch.zeros(20_000, 300)
    draws = nucleus_sample(wide, 1.0, torch.Generator().manual_seed(3))
    assert len(torch.unique(draws)) == 300
