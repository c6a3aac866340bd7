"""sac_spectral: plasticity research toolkit — high-replay-ratio SAC, regularizers, continual streams, diagnostics."""

from sac_spectral.core.threads import configure_openmp

configure_openmp()  # before anything imports torch: libgomp reads its spin-wait setting when torch loads it

__version__ = "0.1.0"

__all__ = ["load_policy"]


def __getattr__(name: str):  # lazily: `import sac_spectral` stays light (no torch before the OpenMP setting)
    if name == "load_policy":
        from sac_spectral.apps.rl.policy import load_policy

        return load_policy
    raise AttributeError(f"module 'sac_spectral' has no attribute '{name}'")
