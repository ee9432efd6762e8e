"""megalith_pipeline: pipeline parallelism over megalith_comm.

    import megalith_comm as comm
    from megalith_pipeline import Pipeline

    mesh = comm.Mesh(comm.init(), pp=4)
    pipe = Pipeline(model, num_microbatches=8, schedule="1f1b", mesh=mesh, loss_fn=loss_fn)
    loss = pipe.step(inputs, targets)      # on the last stage's rank; None elsewhere

Stage partitioning (partition.py), schedules GPipe / 1F1B / interleaved 1F1B /
ZB-H1 (schedules.py), the schedule simulator (simulator.py), activations and
gradients between stages (channels.py), the automatic input/weight split of
backward (backward_split.py). See packages/pipeline/README.md.
"""

from .adapters import gpt2_parts, llama_parts
from .executor import PipelineStageError
from .layers import as_layers
from .partition import Partition, partition
from .parts import PipelineParts
from .pipeline import Pipeline
from .release import free_other_stages
from .schedule import Action, Schedule
from .schedules import NAMES as SCHEDULES
from .schedules import make_schedule
from .simulator import PassTimes, ScheduleDeadlock, Timeline, simulate, theory_bubble_1f1b
from .stage import StageModule
from .stats import StepStats, mean_pass_times, measured_bubble

__version__ = "0.1.0"

__all__ = [
    "SCHEDULES",
    "Action",
    "Partition",
    "PassTimes",
    "Pipeline",
    "PipelineParts",
    "PipelineStageError",
    "Schedule",
    "ScheduleDeadlock",
    "StageModule",
    "StepStats",
    "Timeline",
    "__version__",
    "as_layers",
    "free_other_stages",
    "gpt2_parts",
    "llama_parts",
    "make_schedule",
    "mean_pass_times",
    "measured_bubble",
    "partition",
    "simulate",
    "theory_bubble_1f1b",
]
