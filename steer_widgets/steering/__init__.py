"""Steering and decoding: requests and their plans (one row per output, steer-method maths),
the batched decode loop with per-row sampling, the decoder every caller decodes through
(rows under one lock, the DEFAULT cache, completions) and the results it returns.

Imports ``runtime``, ``sae`` (types only), ``errors`` and ``checks``.
"""
