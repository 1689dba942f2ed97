"""Experimental training options: usable, tested, but not part of the algorithms (yet).

.. warning::
   The API of this package may change or disappear in any release, without a deprecation
   period. The algorithms' configs (:class:`~trainers.magrpo.MAGRPOConfig`,
   :class:`~trainers.mappo.MAPPOConfig`) hold only the algorithms' own options.

What is here (TRL keeps its own in ``trl/experimental/`` on the same terms):

- :class:`ExperimentalMAGRPOConfig` / :class:`ExperimentalMAGRPOTrainer`: MAGRPO with
  counterfactual per-message credit (``credit="counterfactual"``, C3-style,
  :mod:`trainers.experimental.counterfactual`), MAPoRL's α incentives on the tree's joint rewards
  (``alpha0``, ``alpha1``, ``incentive_penalties``; :mod:`trainers.common.incentives`),
  final-turn rewards (``reward_turns="final"``) and n-gram-free training samples
  (``no_repeat_ngram``). With every option at its default the trainer is
  :class:`~trainers.magrpo.MAGRPOTrainer`.

How an option leaves this package for an algorithm's config: it shows a held-out gain over the
algorithm without it, with a paired 95% confidence interval above zero, on a results page of
``docs/results/`` (command, seeds, commit, machine); it has tests that fail without it; and its
config field, help text and a section of ``docs/training.md`` describe it. An option that shows no
such gain stays here or is removed.
"""
from .magrpo import ExperimentalMAGRPOConfig, ExperimentalMAGRPOTrainer

__all__ = ["ExperimentalMAGRPOConfig", "ExperimentalMAGRPOTrainer"]
