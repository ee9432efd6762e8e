"""AutoParallel: the planner that picks dp x tp x pp x sp x ZeRO stage x offload x
micro-batch x checkpointing x schedule from a cost model (types.py has the data).

    from megalith.autoparallel import analyze, load_profile, Cluster, search
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# search and calibrate are imported here, not on first use: their modules share their
# names, and importing such a submodule later would rebind the package's attribute to it
from .calibrate import calibrate
from .search import NoFeasiblePlan, search
from .types import AlphaBeta, BlockCost, Candidate, Cluster, MachineProfile, ModelAnalysis, OpRecord

#: public name -> the module of this package that defines it (imported on first use)
_LAZY = {
    "analyze": "analysis",
    "load_profile": "profiles",
    "load_cluster": "profiles",
    "predict": "cost",
}

__all__ = [
    "AlphaBeta",
    "BlockCost",
    "Candidate",
    "Cluster",
    "MachineProfile",
    "ModelAnalysis",
    "OpRecord",
    "NoFeasiblePlan",
    "calibrate",
    "search",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
