"""verl's plugin entry point: ``import verl`` imports this module, which lets ``trainer.logger`` name ``rl_otel``.

Declared in rl_otel's metadata as ``[project.entry-points."verl.plugins"] rl_otel =
"rl_otel.integrations.verl_plugin"``; ``VERL_USE_EXTERNAL_MODULES=rl_otel.integrations.verl_plugin`` imports it
too. It only runs :func:`rl_otel.integrations.verl.install_from_plugin`; see :mod:`rl_otel.integrations.verl`.
"""

from rl_otel.integrations.verl import install_from_plugin

install_from_plugin()
