"""Rollouts: the pure state machine (machine), the controller that carries out its decisions
(controller), the offline regression gate, steering by hand (promote/abort/retry) and git write-back.
Where a rollout step is decided: `machine`."""
