"""The information-split study: :mod:`.study` (arms, matching, ablation, summaries), :mod:`.run` (its command)."""
