"""`nucleus_sample` keeps exactly transformers' top-p set and samples within it in proportion to the probabilities."""
import pytest
import torch
from transformers.generation.logits_process import TopPLogitsWarper

from llm_marl.backends.hf import nucleus_sample
from llm_marl.backends.hf.sampling import row_keys, token_noise


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


def test_a_rounding_level_change_of_the_logits_changes_no_sample():
    """Two computations of the same logits round differently (a prefill from the KV store against a full one,
    another thread count or batch). Nearly flat rows (a random model) have many logits within that rounding of
    each other: noise laid out by rank would follow their swaps; noise keyed by token id only sees a change
    where two tokens' race values tie within the rounding."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(256, 20_000, generator=gen) * 0.1
    rounded = logits + torch.randn(logits.shape, generator=gen) * 2e-7
    keys = row_keys(3, torch.arange(256), torch.zeros(256, dtype=torch.long))
    for top_p in (0.9, 1.0):
        assert torch.equal(nucleus_sample(logits, top_p, keys=keys), nucleus_sample(rounded, top_p, keys=keys))


def test_a_rows_draw_does_not_depend_on_the_rows_beside_it():
    gen = torch.Generator().manual_seed(1)
    peaked = torch.randn(8, 5000, generator=gen) * 6
    flat = torch.randn(8, 5000, generator=gen) * 0.2            # widens every row's candidates
    keys = row_keys(9, torch.arange(16), torch.zeros(16, dtype=torch.long))
    alone = nucleus_sample(peaked, 0.9, keys=keys[:8])
    assert torch.equal(nucleus_sample(torch.cat([peaked, flat]), 0.9, keys=keys)[:8], alone)


def test_noise_belongs_to_the_token_not_its_place():
    keys = row_keys(5, torch.arange(3), torch.tensor([0, 1, 2]))
    ids = torch.stack([torch.randperm(1000, generator=torch.Generator().manual_seed(r)) for r in range(3)])
    noise = token_noise(keys, ids)
    in_order = token_noise(keys, torch.arange(1000).expand(3, 1000))
    assert torch.equal(noise, in_order.gather(-1, ids))
    assert len(torch.unique(in_order)) > 2990 and abs(in_order.mean().item() - 1) < 0.05  # exponential, mean 1
    other_position = token_noise(
        row_keys(5, torch.arange(3), torch.tensor([1, 2, 3])), torch.arange(1000).expand(3, 1000)
    )
    assert not torch.equal(other_position, in_order)
