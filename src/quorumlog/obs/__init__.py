"""Observability: metrics, health, events and the dashboard (see DESIGN.md)."""
