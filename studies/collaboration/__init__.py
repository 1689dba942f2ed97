"""The compute-matched collaboration study: :mod:`.study` (arms, matching, summaries), :mod:`.run` (its command)."""
