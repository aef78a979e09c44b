"""What the coordinator keeps across a restart of its own process: the state file (the record of
intent, written before any action runs), the decision journal, the epoch that fences an older
coordinator, and the lock that keeps a second one off the same state directory."""
