"""Shells that run protocol cores: real (asyncio, TCP, files) and simulated (virtual time)."""
