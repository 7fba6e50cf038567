"""Probes that measure what the guide's rules of thumb only guess.

``allreduce`` and ``net`` time collectives and point-to-point links over
torch.distributed, ``loader`` sweeps DataLoader settings on the user's own Dataset,
``storage`` reads a dataset folder. Each returns a typed result (a msgspec Struct whose
JSON carries ``"schema": "gpuidle.bench.<name>/1"``); ``report.bench`` renders it.
torch is imported lazily, only by the probes that need it.
"""
