"""Launchers: small scripts that turn configs into runs (no training logic here)."""
