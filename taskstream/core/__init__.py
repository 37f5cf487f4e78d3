"""The pure core: task model, lifecycle state machine, submission validation. No I/O, no clock reads."""
