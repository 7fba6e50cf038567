"""Readers: each turns one kind of evidence into model objects, nothing more."""
