"""Measuring: the MetricSource seam (Prometheus through PromQL) and the analysis of one measurement
(pass, fail or inconclusive, with a typed Cause). Shared by the rollout and experiment controllers."""
