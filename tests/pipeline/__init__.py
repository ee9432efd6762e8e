"""Helpers for the megalith_pipeline tests: small models and the checks each rank runs."""
