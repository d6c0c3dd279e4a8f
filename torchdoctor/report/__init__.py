"""Rendering of a Report: ``console`` (rich, for people) and ``jsonout`` (for machines)."""
