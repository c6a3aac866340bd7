"""The agents' shared options: each network's (:class:`NetConfig`, :class:`ActorConfig`,
:class:`CriticConfig`) and the update's (:class:`SACConfig`; each agent's own section is registered
with it). The run's configuration (env, schedule, resets, priming …) extends it in
:mod:`sac_spectral.apps.rl.config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sac_spectral.agents.base import agent_sections
from sac_spectral.agents.heads import HEAD_OPTIONS, HEADS, PROJECTIONS
from sac_spectral.core.config import at_least, check, option, section
from sac_spectral.core.nets import ACTIVATIONS, INITS
from sac_spectral.core.precision import PRECISIONS
from sac_spectral.core.residual import ARCHS
from sac_spectral.regularizers import validate_specs

#: regularizers that rescale weights after each step, as simbav2's own projection does
SPHERE_CONFLICTS = ("nap", "spectral_norm")
#: what a compiled CPU program's matrix products run on (:mod:`sac_spectral.core.onednn`)
COMPILE_PRODUCTS = ("onednn", "aten")


@dataclass
class NetConfig:
    """Architecture, optimizer and regularizers of one network."""

    arch: str = option("mlp",
                       f"network: {' | '.join(ARCHS)} (bronet, simba: residual LayerNorm nets; simbav2: "
                       "hyperspherical; hidden = [width] * (blocks + 1))")
    hidden: list[int] = option([256, 256], "hidden layer widths")
    activation: str = option("relu", f"hidden activation: {', '.join(ACTIVATIONS)}")
    layer_norm: bool = option(False, "LayerNorm after each hidden linear layer")
    init: str = option("orthogonal",
                       "orthogonal (rl_with_resets: gain √2 and zero bias; an actor's log-std head gain 1) or torch "
                       "(nn.Linear default)")
    lr: float = option(3e-4, "Adam learning rate")
    weight_decay: float = option(0.0, "decoupled weight decay (AdamW); 0 = plain Adam")
    regularizers: list[dict[str, Any]] = option([], "regularizers, e.g. [{name: spectral, coef: 1e-4}]")

    def validate(self) -> None:
        check(len(self.hidden) > 0 and all(h > 0 for h in self.hidden), "hidden",
              f"widths must be positive, got {self.hidden}")
        check(self.arch in ARCHS, "arch", f"'{self.arch}' is not one of {', '.join(ARCHS)}")
        check(self.arch == "mlp" or len(set(self.hidden)) == 1, "hidden",
              f"{self.arch} needs equal widths (the embedding's, then one per residual block), got {self.hidden}")
        check(self.arch == "mlp" or ACTIVATIONS[self.activation][1] == 1, "activation",
              f"{self.arch} keeps the stream's width; '{self.activation}' changes it")
        check(self.activation in ACTIVATIONS, "activation",
              f"'{self.activation}' is not one of {', '.join(ACTIVATIONS)}")
        check(self.arch != "simbav2" or not self.layer_norm, "layer_norm",
              "simbav2 normalizes its features onto the unit sphere; layer_norm: true contradicts it (set it false)")
        projections = [r.get("name") for r in self.regularizers if r.get("name") in SPHERE_CONFLICTS]
        check(self.arch != "simbav2" or not projections, "regularizers",
              f"{', '.join(projections)} rescales weights after each step, which contradicts simbav2's projection of "
              "every weight row onto the unit sphere; drop it")
        check(self.init in INITS, "init", f"'{self.init}' is not one of {', '.join(INITS)}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        at_least(self, 0, "weight_decay")
        validate_specs(self.regularizers, "regularizers")


@dataclass
class ActorConfig(NetConfig):
    log_std_min: float = option(-10.0, "lower bound of the policy's log standard deviation")
    log_std_max: float = option(2.0, "upper bound of the policy's log standard deviation")

    def validate(self) -> None:
        super().validate()
        check(self.log_std_min < self.log_std_max, "log_std_min",
              f"must be < log_std_max ({self.log_std_max}), got {self.log_std_min}")


@dataclass
class CriticConfig(NetConfig):
    num_critics: int = option(2, "Q-networks in the ensemble (min over them in targets)")
    head: str = option("scalar", f"the critic's output: {' | '.join(HEADS)} (docs/agents.md: critic heads)")
    num_atoms: int = option(101, "head=categorical: atoms of the support")
    v_min: float | None = option(None, "head=categorical: the support's lowest atom (v_min and v_max not given: "
                                       "-/+ r_max/(1-gamma), r_max = action_repeat for DMC, whose rewards lie in "
                                       "[0, 1])")
    v_max: float | None = option(None, "head=categorical: the support's highest atom")
    projection: str = option("two_hot", "head=categorical: the target's projection onto the support: "
                                        f"{' | '.join(PROJECTIONS)}")
    sigma: float = option(0.75, "head=categorical, projection=hl_gauss: the Gaussian's std in bin widths")
    num_quantiles: int = option(25, "head=quantile: quantiles per critic")
    drop_top: int = option(0, "head=quantile: TQC's truncation: the top drop_top x num_critics atoms of the pooled "
                              "target are dropped (0 = none)")

    def validate(self) -> None:
        super().validate()
        at_least(self, 1, "num_critics", "num_quantiles")
        check(self.head in HEADS, "head", f"'{self.head}' is not one of {', '.join(HEADS)}")
        defaults = type(self)()
        for head, keys in HEAD_OPTIONS.items():
            changed = next((k for k in keys if getattr(self, k) != getattr(defaults, k)), None)
            check(head == self.head or changed is None, changed or "head",
                  f"is an option of head={head}; this critic's head is {self.head}")
        check(self.num_atoms >= 2, "num_atoms", f"must be >= 2 (a support needs two atoms), got {self.num_atoms}")
        check(self.v_min is None or self.v_max is None or self.v_min < self.v_max, "v_min",
              f"must be < v_max ({self.v_max}), got {self.v_min}")
        check((self.v_min is None) == (self.v_max is None), "v_min",
              "give v_min and v_max together, or neither (derived from the env's reward range)")
        check(self.projection in PROJECTIONS, "projection",
              f"'{self.projection}' is not one of {', '.join(PROJECTIONS)}")
        check(self.sigma > 0, "sigma", f"must be > 0, got {self.sigma}")
        check(0 <= self.drop_top < self.num_quantiles, "drop_top",
              f"must lie in [0, num_quantiles) ({self.num_quantiles}): the pooled target keeps "
              f"(num_quantiles - drop_top) x num_critics atoms, got {self.drop_top}")


@dataclass
class SACConfig:
    gamma: float = option(0.99, "discount")
    tau: float = option(0.005, "Polyak rate of the target critics (every update)")
    precision: str = option("fp32",
                            "fp32, or bf16 matmuls on bf16 weight copies (fp32 master weights, optimizer state, "
                            "losses, targets)")
    compile: bool | Literal["auto"] = option(
        "auto", "torch.compile the whole update: each network's loss, gradient and Adam step as one program (CUDA "
        "graphs on GPU); auto: compile on a CPU with a C++ compiler where the run's updates repay the compile, else "
        "eager (the run says which and why, and its config.yaml records the choice)")
    compile_products: str = option("onednn",
                                   "on a CPU, the update's fp32 matrix products: onednn: oneDNN batched matmuls in "
                                   "compiled programs (about twice MKL's speed on AMD CPUs with full-width AVX-512), "
                                   "and in eager updates where this machine's build of the C++ kernels measured them "
                                   "faster; aten: ATen's bmm (MKL on x86) in both")
    compile_block: int = option(1,
                                "with compile=true: run the updates of one train_steps call (an env step's "
                                "replay_ratio updates, heavy priming's) this many per program call (one program of "
                                "that many updates; its first compile takes minutes); 1: one call per update")
    actor: ActorConfig = section(ActorConfig)
    critic: CriticConfig = section(CriticConfig)

    @classmethod
    def registered_sections(cls) -> dict[str, tuple[type, str]]:
        """Each registered agent's own options (SAC's ``alpha``, TD3's ``td3``, …)."""
        return agent_sections()

    def __post_init__(self) -> None:
        for key, (tp, _) in self.registered_sections().items():
            if key not in self.__dict__:
                setattr(self, key, tp())

    def validate(self) -> None:
        check(0 <= self.gamma <= 1, "gamma", f"must be in [0, 1], got {self.gamma}")
        check(0 < self.tau <= 1, "tau", f"must be in (0, 1], got {self.tau}")
        check(self.compile_block >= 1, "compile_block", f"must be an integer >= 1, got {self.compile_block}")
        check(self.compile_products in COMPILE_PRODUCTS, "compile_products",
              f"'{self.compile_products}' is not one of {', '.join(COMPILE_PRODUCTS)}")
        check(self.precision in PRECISIONS, "precision", f"'{self.precision}' is not one of {', '.join(PRECISIONS)}")
