"""Observing what is live: `forgectl status` collected through the Target protocol as plain data."""
