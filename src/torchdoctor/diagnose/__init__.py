"""Diagnoses: one stateless module per kind, reading tables and events, returning records."""
