"""The two applications, each a folder: :mod:`~sac_spectral.apps.rl` (reinforcement learning runs,
their policies and diagnostics) and :mod:`~sac_spectral.apps.continual` (the continual supervised
runner). Neither imports the other; ``python -m sac_spectral.<app>`` reaches them through the shims
at the package's top."""
