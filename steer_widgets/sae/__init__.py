"""SAEs: one SAE in SAE Lens format, the store that caches them under a byte budget, SAE Lens
releases by name, feature indexes (top tokens and contexts) and Neuronpedia explanations.

Imports ``runtime`` (hook names, the cache folder, model identity), ``errors`` and
``checks``; never steering, analysis, the engine or widgets.
"""
