"""Serving: one model-loading core (``core``), Prometheus metrics and fault injection
(``telemetry``), behind MLServer (``runtimes.serve``) or the seldon-core wrapper
(``runtimes.serve_seldon``)."""
