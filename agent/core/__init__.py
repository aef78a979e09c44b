"""The pure decision core: events in, (state, actions, reason) out. No I/O."""

from agent.core.decide import decide
from agent.core.model import *  # noqa: F403
from agent.core.model import Decision, Phase, Policy, State, initial_state

__all__ = ["decide", "Decision", "Phase", "Policy", "State", "initial_state"]
