"""Presenting: plans as terminal text and Markdown (views), the leaderboard as HTML (report),
manifests as stable YAML (manifests). Pure: drawn from plain values only."""
