"""Unit tests: one module per package module (or probe); shared helpers in *_helpers.py modules,
never imported from another test module."""
