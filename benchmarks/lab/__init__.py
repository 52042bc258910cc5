"""Measurements behind single design choices (normal draws, per-step pieces), kept to rerun when those choices are revisited."""
