"""The model registry: records of registered versions (records: built from Workflows and their
registry files, pure), the leaderboard ranking their variants."""
