"""Figures and the reference run's numbers: plots, reference (printed beside the learner's own)."""
