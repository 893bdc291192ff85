"""Shared test configuration: warnings are errors (pyproject), fixtures live beside their suites."""
