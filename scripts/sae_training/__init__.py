"""The phases of ``scripts/train_default_saes.py`` (its docstring tells the whole run), one
module each: ``corpus`` (1. data), ``activation_cache`` (2. cache), ``training`` (3. train),
``export`` (4. export), ``evaluation`` (5. eval), ``labels`` (6. index), ``reports``
(``quality.json`` and the training report); ``common`` holds names, logging and timings,
``cli`` the command line and the order of the phases.

Import it after ``train_default_saes.py`` has set its environment (offline hub, one torch
thread): the phases import torch.
"""
