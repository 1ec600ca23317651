"""The tile IR (loop nests over tiles) and its passes: schedule, plan, sync, emit."""
