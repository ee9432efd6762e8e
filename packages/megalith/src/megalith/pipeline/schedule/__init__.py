"""ColossalAI's `colossalai.pipeline.schedule` path; see v_schedule.py."""
