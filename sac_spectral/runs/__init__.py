"""Layer 3, what every runner shares: the command line (:mod:`.cli`), the run directory
(:mod:`.rundir`), checkpoints (:mod:`.checkpoint`), TensorBoard (:mod:`.logger`), ``evals.csv``
(:mod:`.evals`), memory estimates (:mod:`.memory`) and :class:`~.run.Run`, a run's life.
The file names of a run directory are in :mod:`.layout` (no torch, for readers such as the report)."""
