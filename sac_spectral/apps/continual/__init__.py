"""The continual supervised application: the runner (:mod:`~sac_spectral.apps.continual.runner`),
its run kind (:mod:`~sac_spectral.apps.continual.kind`, no torch) and dry-run cost
(:mod:`~sac_spectral.apps.continual.cost`)."""
