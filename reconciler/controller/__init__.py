"""Controllers in a loop: `forgectl reconcile [--watch]` walks every endpoint's rollout and
experiment with the machines of `rollout` and `experiment`."""
