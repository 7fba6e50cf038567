"""Renderers: a report in, text out. They format; they compute nothing new."""
