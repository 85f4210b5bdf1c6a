"""Traffic: what each endpoint serves (a ServingState per endpoint, decided from specs and rollout
state) and the one writer that moves it."""
