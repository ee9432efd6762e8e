"""Workers and helpers for the megalith_offload tests."""
