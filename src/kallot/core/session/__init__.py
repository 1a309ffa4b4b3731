"""Sessions: one scheduling period over one Snapshot, run as ordered Actions that write through
a Statement (checkpoint / rollback), after KAI-Scheduler."""
