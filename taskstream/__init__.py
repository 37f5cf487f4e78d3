"""taskstream: an event-sourced, distributed task scheduler."""

__version__ = "0.1.0"
