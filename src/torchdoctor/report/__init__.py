"""Rendering: data in, text out. Renderers are chosen by name (table, json, csv, ...)."""
