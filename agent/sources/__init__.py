"""Event sources: each turns what it sees or hears into the core's events (:mod:`agent.core.model`) and
submits them to the coordinator's decision loop; none changes the state or carries out the core's actions."""
