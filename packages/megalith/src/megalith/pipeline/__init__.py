"""megalith.pipeline: ColossalAI's `colossalai.pipeline` names that scripts import.

Only `schedule.v_schedule` (PipelineGraph, ScheduledNode) is here: scripts build a ZB-V
order with it to pass as HybridParallelPlugin(scheduler_nodes=...). megalith_pipeline
runs the pipelines themselves (HybridParallelPlugin(pp_size=..., pp_style=...)).
"""
