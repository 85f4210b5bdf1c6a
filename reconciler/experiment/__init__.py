"""Experiments: A/B(/n) arms and shadow as a resumable state machine (controller) over pure
statistics of per-arm counts (stats)."""
