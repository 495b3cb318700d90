"""The frameworks' own per-metric code, the baselines of the ``ppo_stats`` rows: what a user runs without rl_otel.

Each module copies its framework's metric code as the framework writes it (its expressions, one ``.item()`` per
metric), on a plain dict of tensors where the framework holds them in its batch object, and says where each part
comes from (file:function). ``tests/test_stats_baselines.py`` checks that each returns what ``ppo_stats`` returns
for the same batch (and, for veRL, what veRL's installed functions return), so the rows time the same numbers.

- :mod:`baselines.verl`: veRL 0.9.1 ``compute_data_metrics`` + the vanilla policy loss's metrics;
- :mod:`baselines.roll`: ROLL's RLVR actor ``loss_func``, critic ``loss_func`` and the driver's data metrics;
- :mod:`baselines.trl`: TRL's legacy ``PPOTrainer`` (``loss`` and ``record_step_stats``), the keys of
  ``names="trl"``.
"""
