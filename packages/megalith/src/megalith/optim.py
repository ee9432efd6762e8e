"""megalith.optim is megalith_core.optim: the fused optimizers (HybridAdam, CPUAdam,
FusedAdam, the SGD and Lion families and `functional`) live in the floor dist, so
that megalith-zero and megalith-offload step with them without the Booster."""

from megalith_core._alias import alias_module

alias_module(__name__, "megalith_core.optim")
