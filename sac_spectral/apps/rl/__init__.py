"""The RL application: the runner (:mod:`~sac_spectral.apps.rl.train`), what one run holds and saves
(:mod:`~sac_spectral.apps.rl.run`), its run kind (:mod:`~sac_spectral.apps.rl.kind`, no torch) and
dry-run cost (:mod:`~sac_spectral.apps.rl.cost`), the trained policy (:mod:`~sac_spectral.apps.rl.policy`,
``load_policy``), and the tools that read a run: :mod:`~sac_spectral.apps.rl.play` and
:mod:`~sac_spectral.apps.rl.diagnose`."""
