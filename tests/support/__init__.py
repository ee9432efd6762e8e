"""Helpers shared by tests of several areas."""
